"""Session-memory extractors: turn a stretch of conversation into a few durable notes.

An :class:`Extractor` gets an :class:`ExtractionJob` (the conversation, where the part not
yet processed starts, and the notes already stored) and returns short bullet texts. Two
are built in:

- :class:`ModelExtractor` asks a model (any ``ModelHandler``, called with the derived
  context it is given) for user preferences and commitments, decisions with their reasons,
  facts learned from tools and open tasks, at most ``max_bullets``, nothing already stored.
- :class:`RuleExtractor` is offline and deterministic (tests, and the default when no
  model is configured): "I prefer / always / never / please ..." statements, decisions,
  the assistant's commitments, open tasks (TODO, next steps) and the first line of each
  tool result.

Both return at most ``max_bullets`` bullets and drop anything already stored; the layer
de-duplicates again against the store before writing (:func:`dedupe_bullets`), so a
custom extractor cannot write the same note twice either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
from attrs import field, frozen

from tinyctx import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolResult,
    UserMessage,
)
from tinyctx.config import Check, function, integer
from tinyctx.frozen import thaw
from tinyctx.model import ModelHandler
from tinyctx.stores import Note

__all__ = [
    "ExtractionJob",
    "Extractor",
    "RuleExtractor",
    "ModelExtractor",
    "EXTRACTION_PROMPT",
    "bullet_key",
    "dedupe_bullets",
    "parse_bullets",
    "render_transcript",
    "check_bullets",
    "is_original",
    "DERIVED_MARKS",
]


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return value if type(value) is tuple else tuple(value)


def _notes(value: Iterable[Note]) -> tuple[Note, ...]:
    return value if type(value) is tuple else tuple(value)


@frozen
class ExtractionJob:
    """What one extraction works on.

    ``messages[since:]`` (:attr:`new_messages`) is every message committed since the last
    extraction, each as it was committed: a tool result compaction cleared since, or a
    head a summary replaced, comes with its original content. ``messages[:since]`` is the
    history earlier extractions read, as the conversation holds it now (empty once it was
    rewritten), for context. ``existing`` are the notes already in ``namespace``, oldest
    first: an extractor must not propose them again.
    """

    messages: tuple[Message, ...] = field(converter=_messages)
    since: int = 0
    existing: tuple[Note, ...] = field(default=(), converter=_notes)
    namespace: str = ""

    @property
    def new_messages(self) -> tuple[Message, ...]:
        return self.messages[self.since :]

    @property
    def existing_texts(self) -> tuple[str, ...]:
        return tuple(note.text for note in self.existing)


@runtime_checkable
class Extractor(Protocol):
    """Proposes note texts for a job. Raising (or being cancelled) fails the extraction:
    nothing is written and the session's counters keep their deltas, so it is retried."""

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> Sequence[str]: ...


# ---------------------------------------------------------------------------------------
# bullets: parse, normalize, de-duplicate

_BULLET_MARK = re.compile(r"^\s*(?:[-*\u2022\u00b7]|\d{1,3}[.)])\s+")
_NOT_WORD = re.compile(r"[\W_]+", re.UNICODE)


def bullet_key(text: str) -> str:
    """The comparison key of a note: case, punctuation, spacing and a list mark ignored."""
    return _NOT_WORD.sub(" ", _BULLET_MARK.sub("", text).casefold()).strip()


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "\u2026"


def dedupe_bullets(
    candidates: Iterable[str],
    existing: Iterable[str] = (),
    *,
    limit: int | None = None,
) -> list[str]:
    """``candidates`` (stripped, whitespace collapsed) without blanks, without repeats among
    themselves and without anything in ``existing``, in order, at most ``limit``."""
    seen = {bullet_key(text) for text in existing}
    kept: list[str] = []
    for candidate in candidates:
        if not isinstance(candidate, str):
            raise TypeError(f"an extractor must return strings, got {type(candidate).__name__}")
        text = " ".join(candidate.split())
        key = bullet_key(text)
        if not key or key in seen:
            continue
        seen.add(key)
        kept.append(text)
        if limit is not None and len(kept) >= limit:
            break
    return kept


def parse_bullets(text: str) -> list[str]:
    """Bullet texts from a model answer: list items (``-``, ``*``, ``•``, ``1.``); when the
    answer has no list marks, its non-empty lines. ``NONE`` (any case) means no bullets."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines or (len(lines) == 1 and lines[0].strip(".").upper() == "NONE"):
        return []
    marked = [_BULLET_MARK.sub("", line) for line in lines if _BULLET_MARK.match(line)]
    if marked:
        return [b for b in marked if b]
    return [line for line in lines if not line.endswith(":") and line.upper() != "NONE"]


_POSITIVE = integer(minimum=1)
_PROMPT: Check[str] = Check(
    lambda value: isinstance(value, str) and "{max_bullets}" in value,
    "a str with a {max_bullets} placeholder",
)


# ---------------------------------------------------------------------------------------
# the offline, deterministic extractor

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_DECISION = re.compile(
    r"\b(?:decided|decide to|decision|agreed|settled on|going with|go with|chose|"
    r"we(?:'ll| will) use|let'?s use|we(?:'re| are) using)\b",
    re.IGNORECASE,
)
_TASK = re.compile(
    r"\b(?:todo|fixme|next steps?|next up|still need to|still have to|remaining|"
    r"follow[- ]up|open tasks?|action items?|later we|not done yet)\b",
    re.IGNORECASE,
)
_PREFERENCE = re.compile(
    r"\b(?:i|we)\s+(?:really\s+|usually\s+|generally\s+)?(?:prefer|always|never|like|love|"
    r"hate|dislike|want|don'?t want|do not want|need)\b|\bplease\b|\bmy (?:name|favou?rite|"
    r"preferred)\b|\bcall me\b|\bremember (?:that|to)\b",
    re.IGNORECASE,
)
_COMMITMENT = re.compile(
    r"\b(?:i(?:'ll| will| shall)|i am going to|i'm going to|i promise)\b", re.IGNORECASE
)


DERIVED_MARKS = frozenset({"cleared", "truncated", "summary", "synthetic"})
"""``metadata["tinyctx"]`` keys of content the framework wrote in place of the original:
a cleared or truncated tool result, a summary, a synthetic answer to a call that never ran."""


def is_original(message: Message) -> bool:
    """Whether ``message`` holds what was said or returned, not a placeholder, a cut, a
    summary or a synthetic answer (see :data:`DERIVED_MARKS`): only those are a source of
    facts."""
    own = message.metadata.get("tinyctx")
    return not (isinstance(own, Mapping) and DERIVED_MARKS.intersection(own))


def check_bullets(value: object, extractor: object) -> list[str]:
    """An extractor's answer as a list of str, or a TypeError saying what it returned:
    a list or tuple of str is required (a str or a mapping would be iterated as notes)."""
    owner = f"{type(extractor).__name__}.extract"
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{owner} must return a list or tuple of str, got {type(value).__name__}; "
            "nothing was written"
        )
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(
                f"{owner} must return a list or tuple of str, but item {index} is "
                f"{type(item).__name__}; nothing was written"
            )
    return list(value)


def _sentences(text: str) -> Iterable[str]:
    for line in text.splitlines():
        line = _BULLET_MARK.sub("", line).strip()
        if not line:
            continue
        for sentence in _SENTENCE_END.split(line):
            sentence = sentence.strip()
            if sentence and not sentence.endswith("?"):
                yield sentence


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


class RuleExtractor:
    """Deterministic notes from patterns, no model needed.

    Scans the new messages only. Bullets come labelled and in this priority: user
    preferences ("I prefer/always/never/like/want/need ...", "please ...", "my name is",
    "call me", "remember that/to"), decisions (user or assistant: "decided", "agreed",
    "going with", "we'll use"...), commitments (assistant: "I'll", "I will"), open tasks
    (TODO, next steps, still need to, follow up), then facts from tools (the first line
    of each successful, real tool result). Within a category, conversation order.
    Cleared or truncated tool results, summaries and synthetic answers are never a source
    (:func:`is_original`).
    Questions are skipped; each bullet is clipped to ``max_chars``.
    """

    name = "rules"

    def __init__(self, *, max_bullets: int = 8, max_chars: int = 200) -> None:
        self.max_bullets = _POSITIVE.check(max_bullets, "max_bullets", "RuleExtractor")
        self.max_chars = _POSITIVE.check(max_chars, "max_chars", "RuleExtractor")

    def __repr__(self) -> str:
        return f"RuleExtractor(max_bullets={self.max_bullets}, max_chars={self.max_chars})"

    def candidates(self, messages: Sequence[Message]) -> list[str]:
        """Every labelled candidate in priority order (no cap, no de-duplication)."""
        preferences: list[str] = []
        decisions: list[str] = []
        commitments: list[str] = []
        tasks: list[str] = []
        facts: list[str] = []
        for message in messages:
            if not is_original(message):
                continue
            if isinstance(message, ToolResult):
                if message.is_error:
                    continue
                line = _first_line(message.describe())
                if line:
                    facts.append(f"From {message.name or 'a tool'}: {line}")
                continue
            is_user = isinstance(message, UserMessage)
            if not is_user and not isinstance(message, AssistantMessage):
                continue
            for sentence in _sentences(message.text):
                if _DECISION.search(sentence):
                    decisions.append(f"Decision: {sentence}")
                elif _TASK.search(sentence):
                    tasks.append(f"Open task: {sentence}")
                elif is_user and _PREFERENCE.search(sentence):
                    preferences.append(f"User preference: {sentence}")
                elif not is_user and _COMMITMENT.search(sentence):
                    commitments.append(f"Commitment: {sentence}")
        ordered = [*preferences, *decisions, *commitments, *tasks, *facts]
        return [_clip(text, self.max_chars) for text in ordered]

    def propose(self, messages: Sequence[Message], existing: Iterable[str] = ()) -> list[str]:
        """The bullets for ``messages``: candidates without ``existing`` or repeats, capped."""
        return dedupe_bullets(self.candidates(messages), existing, limit=self.max_bullets)

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return self.propose(job.new_messages, job.existing_texts)


# ---------------------------------------------------------------------------------------
# the model-backed extractor

EXTRACTION_PROMPT = """\
You keep the long-term memory of an assistant. From the conversation below, extract only \
durable information worth knowing in a later session:
1. the user's preferences and commitments (what they want, always or never do; what the \
assistant promised to do);
2. decisions that were made, each with its reason;
3. facts learned from tool results;
4. open tasks and next steps.
Rules: at most {max_bullets} bullets, one per line, each starting with "- "; each bullet \
self-contained and under {max_chars} characters; never repeat, even reworded, anything \
listed under "Already stored"; no commentary. If nothing new is worth storing, answer \
exactly NONE."""


def render_transcript(
    messages: Sequence[Message], *, max_message_chars: int = 1500, max_chars: int = 24000
) -> str:
    """A plain-text transcript, one ``[role] text`` entry per message, each clipped; when
    it exceeds ``max_chars`` the oldest entries are left out (and that is said)."""
    entries: list[str] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            parts = [message.content] if message.content else []
            parts += [
                f"(calls {c.name} {json.dumps(thaw(c.arguments), ensure_ascii=False)})"
                for c in message.tool_calls
            ]
            body, label = " ".join(parts), "assistant"
        elif isinstance(message, ToolResult):
            body = message.describe()
            label = f"tool {message.name}" + (" error" if message.is_error else "")
        else:
            body, label = message.describe(), message.role
        entries.append(f"[{label}] {_clip(body, max_message_chars)}")
    kept: list[str] = []
    size = 0
    for entry in reversed(entries):
        if size + len(entry) + 1 > max_chars and kept:
            break
        kept.append(entry)
        size += len(entry) + 1
    kept.reverse()
    omitted = len(entries) - len(kept)
    if omitted:
        kept.insert(0, f"[... {omitted} earlier messages left out]")
    return "\n".join(kept)


class ModelExtractor:
    """Asks a model for memory notes.

    ``model`` is any ``ModelHandler`` (a provider adapter, or an agent's model onion); it is
    called with the context the layer hands the extraction (a child of the run: linked
    cancellation, shared usage and events), and the call is raced against that context's
    cancellation token. Its usage is added to the tree's usage tracker. The prompt lists the
    notes already stored; the answer is parsed as bullets, de-duplicated against them and
    capped at ``max_bullets``.
    """

    name = "model"

    def __init__(
        self,
        model: ModelHandler,
        *,
        max_bullets: int = 8,
        max_chars: int = 200,
        model_name: str | None = None,
        prompt: str = EXTRACTION_PROMPT,
        max_transcript_chars: int = 24000,
        max_existing: int = 100,
        settings: dict[str, Any] | None = None,
    ) -> None:
        owner = "ModelExtractor"
        function(allowed="an async callable (request, ctx) -> ModelResponse").check(
            model, "model", owner
        )
        self.model = model
        self.max_bullets = _POSITIVE.check(max_bullets, "max_bullets", owner)
        self.max_chars = _POSITIVE.check(max_chars, "max_chars", owner)
        self.max_transcript_chars = _POSITIVE.check(
            max_transcript_chars, "max_transcript_chars", owner
        )
        self.max_existing = _POSITIVE.check(max_existing, "max_existing", owner)
        self.prompt = _PROMPT.check(prompt, "prompt", owner)
        self.model_name = model_name
        self.settings = dict(settings or {})

    def __repr__(self) -> str:
        return f"ModelExtractor({self.model!r}, max_bullets={self.max_bullets})"

    def build_request(self, job: ExtractionJob) -> ModelRequest:
        """The request this extractor sends for ``job`` (public: inspect or log it)."""
        existing = job.existing_texts[-self.max_existing :]
        stored = "\n".join(f"- {text}" for text in existing) if existing else "(nothing yet)"
        transcript = render_transcript(job.new_messages, max_chars=self.max_transcript_chars)
        content = f"Already stored:\n{stored}\n\nConversation:\n{transcript}"
        system = self.prompt.format(max_bullets=self.max_bullets, max_chars=self.max_chars)
        return ModelRequest(
            messages=(UserMessage(content),),
            system_prompt=system,
            model=self.model_name,
            settings=self.settings,
            metadata={"tinyctx": {"purpose": "session_memory.extraction"}},
        )

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
        if not job.new_messages:
            await anyio.lowlevel.checkpoint()
            return []
        request = self.build_request(job)

        async def ask() -> ModelResponse:
            return await self.model(request, ctx)

        response = await ctx.cancellation.race(ask, "session_memory.extract")
        if response.usage is not None:
            ctx.usage.add(response.model or request.model, response.usage)
        bullets = [_clip(b, self.max_chars) for b in parse_bullets(response.text)]
        return dedupe_bullets(bullets, job.existing_texts, limit=self.max_bullets)
