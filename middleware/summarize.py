"""Summarization: replace the older part of a history with one summary message.

:func:`summarize_history` is the function (history in, new history and stats out) that the
:class:`Summarize` layer wraps and the budget guard reuses as a pressure policy. The text
comes from a :class:`Summarizer`: :class:`ModelSummarizer` asks a model through the same
``call_model`` signature, :class:`ExtractiveSummarizer` works offline and deterministically.

The newest ``keep_recent`` messages stay verbatim. The split moves back (the kept tail
grows) until no tool call is separated from its results, so calls still waiting for their
results are never summarized. Leading system messages stay in front, and system messages
inside the summarized part are kept too (a summary never drops a system message). The
summarized messages become one user message, marked ``metadata["tinyctx"]["summary"]``,
whose text starts ``[auto-compacted] Summary of N earlier messages:``. An empty or failing
summary raises :class:`SummarizationError` and changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from attrs import frozen

from tinyctx import (
    AssistantMessage,
    ConfigError,
    Event,
    Interrupted,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    PairingError,
    RunCancelled,
    RunContext,
    SystemMessage,
    TinyCtxError,
    ToolResult,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.events import EventLevel, ModelCallFinished
from tinyctx.frozen import thaw
from tinyctx.messages import check_pairing, snap_boundary
from tinyctx.model import ModelHandler
from tinyctx.parts import TextPart, describe_part
from tinyctx.tokens import TokenCounter, default_counter

from ._compaction import (
    as_history,
    check_bool,
    check_counter,
    check_int,
    commit,
    tinyctx_meta,
)
from .policy import Relief
from .triggers import Keep, Trigger
from .triggers import keep as as_keep
from .triggers import trigger as as_trigger

__all__ = [
    "SUMMARY_PREFIX",
    "DEFAULT_SUMMARY_PROMPT",
    "Summarizer",
    "SummarizationError",
    "SummaryStats",
    "summary_split",
    "summarize_history",
    "is_summary",
    "digest_end",
    "render_transcript",
    "ModelSummarizer",
    "ExtractiveSummarizer",
    "Summarize",
    "SummaryApplied",
    "SummaryFailed",
]

SUMMARY_PREFIX = "[auto-compacted] Summary of {count} earlier messages:"

DEFAULT_SUMMARY_PROMPT = """\
You compact the earlier part of a conversation between a user and an AI agent that uses \
tools, so the agent can continue the work without it. Write a dense summary that keeps:
- the user's goals, requests and constraints, in their own words where it matters;
- decisions made, and why;
- facts found through tools: file paths, names, identifiers, numbers, commands, errors and \
results, exactly as they appeared;
- what has been done so far;
- open work: what is unfinished, pending questions and the next steps.
Use short headed sections or bullet points. Never invent anything, never address the user, \
and write no preamble: output the summary only."""


class SummarizationError(TinyCtxError):
    """The summarizer failed or returned no text; the history was left as it was."""


@runtime_checkable
class Summarizer(Protocol):
    """Writes the summary text of ``messages`` (the part of the history being replaced)."""

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str: ...


@frozen
class SummaryStats:
    """What one summarization did; ``summarized == 0`` when it did nothing."""

    summarized: int = 0
    """Messages replaced by the summary."""
    kept: int = 0
    """Messages kept verbatim (leading and inner system messages, and the tail)."""
    lead: int = 0
    """Index in the input where the summarized part starts (after leading system messages)."""
    split: int = 0
    """Index in the input where the verbatim tail starts; the summary is just before it."""
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def tokens_freed(self) -> int:
        return self.tokens_before - self.tokens_after

    @property
    def changed(self) -> bool:
        return self.summarized > 0


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a summary written by :func:`summarize_history`."""
    return "summary" in tinyctx_meta(message)


def _stack(history: Sequence[Message], lead: int, keep_summaries: int) -> tuple[int, int]:
    """``(lead, fold)`` for the summaries that follow ``history[:lead]``: when there are at
    most ``keep_summaries`` of them they stay in front (``lead`` moves past them, ``fold``
    is the new lead), else they are all folded into the next summary (``lead`` stays,
    ``fold`` is where they end: the summarized part reaches at least there)."""
    end = lead
    while end < len(history) and is_summary(history[end]):
        end += 1
    return (end, end) if end - lead <= keep_summaries else (lead, end)


def _system_lead(history: Sequence[Message]) -> int:
    """How many system messages the history starts with."""
    lead = 0
    while lead < len(history) and isinstance(history[lead], SystemMessage):
        lead += 1
    return lead


def _may_be_task(message: Message) -> bool:
    """Whether ``message``, first after the system messages, is a task a summary can keep
    in front of it: a user message that is not itself a summary."""
    return isinstance(message, UserMessage) and not is_summary(message)


def digest_end(history: Sequence[Message]) -> int:
    """Where the digest a summarized history starts with ends: the leading system messages,
    the task kept in front of the summaries (``keep_task``), the summaries (and system
    messages among them); 0 when the history does not start with one. A trim keeps it
    until the raw turns after it are gone (:func:`~tinyctx.middleware.trim.trim_oldest`)."""
    index, n = _system_lead(history), len(history)
    if index < n and _may_be_task(history[index]):
        index += 1
    end = 0
    while index < n:
        message = history[index]
        if is_summary(message):
            end = index + 1
        elif not isinstance(message, SystemMessage):
            break
        index += 1
    return end


def summary_split(
    history: Sequence[Message],
    keep_recent: int = 10,
    *,
    keep_task: bool = False,
    forward: bool = False,
    keep_summaries: int = 0,
) -> tuple[int, int] | None:
    """``(lead, split)``: ``history[lead:split]`` is what a summary replaces, or None.

    ``lead`` counts the leading system messages, and with ``keep_task`` the first user
    message after them too (the task, kept verbatim in front of the summary, unless it is
    itself a summary), and then the earlier summaries that follow when there are at most
    ``keep_summaries`` of them (more: they are all summarized again, folded into the new
    one, whatever ``keep_recent`` says); ``split`` is ``len - keep_recent`` moved back to
    the nearest cut that separates no tool call from its results (a call waiting for its
    results at the end included), or with ``forward`` on to the next such cut when one comes
    before the end (the tail then holds at most ``keep_recent`` messages). None when the
    history is not longer than ``keep_recent`` or nothing but system messages would go.

    Only the last tool-call turn before the target can straddle it (results come before
    the next assistant message), so the cut is snapped within the window from that turn's
    assistant message on: the cost grows with ``keep_recent``, not with the history.
    """
    check_int(keep_recent, "keep_recent", "summary_split")
    check_int(keep_summaries, "keep_summaries", "summary_split")
    count = len(history)
    if count <= keep_recent:
        return None
    lead = _system_lead(history)
    if keep_task and lead < count and _may_be_task(history[lead]):
        lead += 1
    lead, fold = _stack(history, lead, keep_summaries)
    target = max(count - keep_recent, fold)
    if target <= lead:
        return None
    if forward:
        ahead = snap_boundary(history, target, direction="forward")
        if ahead < count:
            target = ahead
    window = target - 1
    while window >= 0 and not isinstance(history[window], AssistantMessage):
        window -= 1
    split = target
    if window >= 0:  # a cut before an assistant message separates nothing
        split = window + snap_boundary(history[window:], target - window, direction="backward")
    for index in range(lead, split):
        if not isinstance(history[index], SystemMessage):
            return lead, split
    return None


async def summarize_history(
    history: Sequence[Message],
    summarizer: Summarizer,
    ctx: RunContext[Any],
    keep_recent: int = 10,
    *,
    counter: TokenCounter | None = None,
    keep_task: bool = False,
    forward: bool = False,
    keep_summaries: int = 0,
) -> tuple[tuple[Message, ...], SummaryStats]:
    """Replace the older part of ``history`` with one summary message.

    ``keep_task``, ``forward`` and ``keep_summaries`` choose the split as
    :func:`summary_split` does.

    Returns the input tuple itself (and no summarizer call is made) when there is nothing
    to summarize. Raises :class:`SummarizationError` when the summarizer fails or returns
    only whitespace; cancellation and interrupts propagate as they are. Either way the
    input is not changed.
    """
    history = as_history(history)
    plan = summary_split(
        history, keep_recent, keep_task=keep_task, forward=forward, keep_summaries=keep_summaries
    )
    if plan is None:
        return history, SummaryStats(kept=len(history))
    lead, split = plan
    head = history[lead:split]
    inner_system = tuple(m for m in head if isinstance(m, SystemMessage))
    replaced = tuple(m for m in head if not isinstance(m, SystemMessage)) if inner_system else head
    text = await _ask(summarizer, replaced, ctx)
    summary = UserMessage(
        f"{SUMMARY_PREFIX.format(count=len(replaced))}\n{text}",
        metadata={
            "tinyctx": {
                "summary": {
                    "messages": len(replaced),
                    "summarizer": type(summarizer).__name__,
                }
            }
        },
    )
    new = (*history[:lead], *inner_system, summary, *history[split:])
    count_messages = (counter or default_counter()).count_messages
    stats = SummaryStats(
        summarized=len(replaced),
        kept=len(new) - 1,
        lead=lead,
        split=split,
        tokens_before=count_messages(history),
        tokens_after=count_messages(new),
    )
    return new, stats


async def _ask(summarizer: Summarizer, messages: tuple[Message, ...], ctx: RunContext[Any]) -> str:
    """The summary text, raced against the run's cancellation; errors become one type."""
    try:
        text = await ctx.cancellation.race(lambda: summarizer.summarize(messages, ctx), "summarize")
    except (RunCancelled, Interrupted):
        raise
    except SummarizationError:
        raise
    except Exception as exc:
        raise SummarizationError(
            f"{type(summarizer).__name__} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(text, str):
        raise SummarizationError(
            f"{type(summarizer).__name__} returned {type(text).__name__}, expected str"
        )
    text = text.strip()
    if not text:
        raise SummarizationError(f"{type(summarizer).__name__} returned an empty summary")
    return text


# ---------------------------------------------------------------------------------------
# transcripts


def _squash(text: str) -> str:
    return " ".join(text.split())


def _middle_cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, its middle replaced by a note."""
    if len(text) <= limit:
        return text
    note = f" [... {len(text) - limit} characters omitted ...] "
    keep = max(limit - len(note), 0)
    head = keep * 2 // 5
    return text[:head] + note + text[len(text) - (keep - head) :] if keep else text[:limit]


def _described(message: Message, limit: int) -> str:
    """A message's :meth:`~tinyctx.Message.describe` within about ``limit`` characters: its
    text is cut in the middle, an image or a document is named whole (its URL too: a URL
    cut short could not be fetched again)."""
    content = getattr(message, "content", "")
    if isinstance(content, str):
        return _middle_cut(content, limit)
    texts = sum(1 for part in content if isinstance(part, TextPart)) or 1
    return "\n".join(
        _middle_cut(part.text, limit // texts)
        if isinstance(part, TextPart)
        else describe_part(part)
        for part in content
    )


def _arguments(arguments: Mapping[str, Any]) -> str:
    return json.dumps(thaw(arguments), ensure_ascii=False, sort_keys=True, default=str)


def _render(message: Message, limit: int) -> str:
    """One message as a transcript block: role, tool calls with arguments, results."""
    if isinstance(message, ToolResult):
        label = f"tool result {message.name}".rstrip() + (" (error)" if message.is_error else "")
        if "cleared" in tinyctx_meta(message):
            return f"[{label}] (content cleared earlier)"
        return f"[{label}] {_described(message, limit)}"
    if isinstance(message, AssistantMessage):
        lines = [f"[assistant] {_middle_cut(message.content, limit)}"] if message.content else []
        for call in message.tool_calls:
            args = _middle_cut(_arguments(call.arguments), limit)
            lines.append(f"[assistant calls {call.name}] {args}")
        return "\n".join(lines) or "[assistant] (no text)"
    return f"[{message.role}] {_described(message, limit)}"


def render_transcript(
    messages: Sequence[Message],
    *,
    max_tokens: int,
    counter: TokenCounter | None = None,
    block_chars: int = 6000,
    head_share: float = 0.3,
) -> str:
    """The messages as a plain-text transcript within about ``max_tokens``.

    Each message is one block (role, text, tool calls with their arguments, results),
    capped at ``block_chars`` by cutting its middle. When the whole does not fit, blocks are
    dropped from the middle of the transcript, not its end: up to ``head_share`` of the
    budget keeps the oldest blocks (where the goals are stated), the rest the newest, and a
    note says how many messages were left out. The first and the last message always
    appear, cut in their middle when they alone are too long.
    """
    count_text = (counter or default_counter()).count_text
    blocks = [_render(m, block_chars) for m in messages]
    sizes = [count_text(b) + 1 for b in blocks]
    if sum(sizes) <= max_tokens:
        return "\n".join(blocks)
    note_tokens = 16

    def squeeze(index: int, room: int) -> str | None:
        chars = len(blocks[index]) * room // max(sizes[index], 1)
        return _middle_cut(blocks[index], chars) if chars >= 64 else None

    first: list[str] = []
    start, used = 0, 0
    head_budget = int(max_tokens * head_share)
    while start < len(blocks) - 1 and used + sizes[start] <= head_budget:
        first.append(blocks[start])
        used += sizes[start]
        start += 1
    if not first and (cut := squeeze(0, head_budget)) is not None:
        first.append(cut)
        used = head_budget
        start = 1
    last: list[str] = []
    end = len(blocks)
    room = max_tokens - used - note_tokens
    while end > start:
        size = sizes[end - 1]
        if size <= room:
            last.append(blocks[end - 1])
            room -= size
            end -= 1
            continue
        if not last and (cut := squeeze(end - 1, room)) is not None:
            last.append(cut)
            end -= 1
        break
    omitted = end - start
    middle = [f"[... {omitted} messages omitted from the middle ...]"] if omitted else []
    return "\n".join([*first, *middle, *reversed(last)])


# ---------------------------------------------------------------------------------------
# summarizers


class ModelSummarizer:
    """Asks a model for a dense summary, through the ``call_model`` signature.

    ``model`` is any model handler ``async (request, ctx) -> ModelResponse`` (a provider
    adapter, an agent's model or a whole onion). It is called with a child context
    (``ctx.derive``, tagged ``tinyctx:summarize``, with its own conversation), no tools, and
    one user message holding the transcript; its usage is added to the run's trackers.
    The transcript is capped at ``max_transcript_tokens`` (and at 3/4 of the run's usable
    window when that is known), dropping messages from the middle.
    """

    def __init__(
        self,
        model: ModelHandler,
        *,
        model_name: str | None = None,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        max_transcript_tokens: int = 24_000,
        settings: Mapping[str, Any] | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        if not callable(model):
            raise ConfigError("model", model, "an async model handler", owner="ModelSummarizer")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("prompt", prompt, "a non-empty string", owner="ModelSummarizer")
        self.model = model
        self.model_name = model_name
        self.prompt = prompt
        self.max_transcript_tokens = check_int(
            max_transcript_tokens, "max_transcript_tokens", "ModelSummarizer", minimum=256
        )
        self.settings = dict(settings or {})
        self.counter = check_counter(counter, "ModelSummarizer")

    def request_for(self, messages: Sequence[Message], ctx: RunContext[Any]) -> ModelRequest:
        """The request this summarizer sends for ``messages``."""
        budget = self.max_transcript_tokens
        usable = ctx.config.usable_tokens
        if usable is not None:
            budget = max(256, min(budget, usable * 3 // 4))
        transcript = render_transcript(messages, max_tokens=budget, counter=self.counter)
        text = (
            f"Summarize these {len(messages)} earlier messages of the conversation.\n\n"
            f"<transcript>\n{transcript}\n</transcript>"
        )
        return ModelRequest(
            messages=(UserMessage(text),),
            system_prompt=self.prompt,
            model=self.model_name or ctx.config.model,
            settings=self.settings,
        )

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        request = self.request_for(messages, ctx)
        child = ctx.derive(tags=("tinyctx:summarize",), conversation=Conversation(request.messages))
        started = time.perf_counter()
        response = await self.model(request, child)
        if not isinstance(response, ModelResponse):
            raise TypeError(f"the summary model returned {type(response).__name__}")
        usage = response.usage
        model = response.model or request.model
        if usage is not None:
            ctx.usage.add(model, usage)
        child.emit(
            ModelCallFinished,
            **ModelCallFinished.fields_of(request, response, time.perf_counter() - started),
        )
        return response.message.content


class ExtractiveSummarizer:
    """An offline, deterministic summary: no model, the same input gives the same text.

    Keeps, within ``max_tokens``: the earlier summaries being rolled up (together at most
    ``4 * line_chars`` characters, shared evenly, so folding a stack of them leaves room for
    the rest), the user's goals, the last assistant statements, and each tool call with its
    arguments and the first lines of its result. When not everything fits, the first and
    latest goals and the latest statements go first, then tool calls from the newest back;
    what did not fit is counted.
    """

    def __init__(
        self,
        max_tokens: int = 1000,
        *,
        line_chars: int = 240,
        statements: int = 3,
        counter: TokenCounter | None = None,
    ) -> None:
        owner = "ExtractiveSummarizer"
        self.max_tokens = check_int(max_tokens, "max_tokens", owner, minimum=16)
        self.line_chars = check_int(line_chars, "line_chars", owner, minimum=16)
        self.statements = check_int(statements, "statements", owner)
        self.counter = check_counter(counter, owner)

    def _line(self, text: str, scale: int = 1) -> str:
        return _middle_cut(_squash(text), self.line_chars * scale)

    def _first_lines(self, text: str, count: int = 2) -> str:
        lines = [line for line in (raw.strip() for raw in text.splitlines()[:20]) if line]
        return self._line(" | ".join(lines[:count])) if lines else "(empty)"

    def _message_line(self, message: Message, scale: int = 1, *, first: bool = False) -> str:
        """A message as a summary line: its text cut (``first``: only its first lines), an
        image or a document named whole, so a URL stays fetchable."""
        content = getattr(message, "content", "")
        if isinstance(content, str):
            return self._first_lines(content) if first else self._line(content, scale)
        texts = [
            self._first_lines(part.text) if first else self._line(part.text, scale)
            for part in content
            if isinstance(part, TextPart)
        ]
        media = [describe_part(part) for part in content if not isinstance(part, TextPart)]
        return " | ".join([*texts[:1], *media] if first else [*texts, *media])

    def extract(self, messages: Sequence[Message]) -> str:
        """The summary text of ``messages`` (never empty for a non-empty input)."""
        earlier: list[str] = []
        goals: list[str] = []
        statements: list[str] = []
        calls: list[str] = []
        results: dict[str, str] = {}
        rolled = sum(1 for m in messages if is_summary(m))
        for message in messages:
            if isinstance(message, ToolResult):
                if "cleared" in tinyctx_meta(message):
                    line = "(result cleared earlier)"
                else:
                    line = self._message_line(message, first=True)
                results[message.tool_call_id] = ("error: " if message.is_error else "") + line
        for message in messages:
            if is_summary(message):
                body = message.text.split("\n", 1)[1] if "\n" in message.text else ""
                earlier.append(_middle_cut(_squash(body), self.line_chars * 4 // rolled))
            elif (
                isinstance(message, UserMessage)
                and message.essential
                and message.describe().strip()
            ):
                # the first request usually states the task: give it more room
                goals.append(self._message_line(message, 1 if goals else 3))
            elif isinstance(message, AssistantMessage):
                if message.content.strip():
                    statements.append(self._line(message.content))
                for call in message.tool_calls:
                    args = _middle_cut(_arguments(call.arguments), self.line_chars // 2)
                    outcome = results.get(call.id, "(no result)")
                    calls.append(f"{call.name}({args}) -> {outcome}")
        sections = [
            ("Earlier summary", earlier),
            ("User goals", goals),
            ("Tool calls", calls),
            (
                "Last assistant statements",
                statements[-self.statements :] if self.statements else [],
            ),
        ]
        if not any(items for _, items in sections):
            return f"{len(messages)} earlier messages without text content."
        return (
            self._fit(sections)
            or f"{len(messages)} earlier messages (none fit {self.max_tokens} tokens)."
        )

    def _fit(self, sections: list[tuple[str, list[str]]]) -> str:
        """Render the sections, choosing items by priority while they fit ``max_tokens``."""
        count_text = (self.counter or default_counter()).count_text
        earlier, goals, calls, last = (items for _, items in sections)
        # (section, item) in the order they earn a place: an earlier summary, the first and
        # the latest goal, the latest statements, other goals, then tool calls newest first
        order: list[tuple[int, int]] = [(0, i) for i in range(len(earlier))]
        order += [(1, 0), (1, len(goals) - 1)] if goals else []
        order += [(3, i) for i in range(len(last) - 1, -1, -1)]
        order += [(1, i) for i in range(len(goals) - 2, 0, -1)]
        order += [(2, i) for i in range(len(calls) - 1, -1, -1)]
        order = list(dict.fromkeys(order))
        headers = 12 * sum(1 for _, items in sections if items)  # room for section titles
        chosen: list[tuple[int, int]] = []
        used = 0
        for section, index in order:
            cost = count_text(sections[section][1][index]) + 2
            if used + cost <= self.max_tokens - headers:
                chosen.append((section, index))
                used += cost
        text = self._render(sections, set(chosen))
        # estimates of parts need not add up to the estimate of the whole: make sure
        while chosen and count_text(text) > self.max_tokens:
            chosen.pop()
            text = self._render(sections, set(chosen))
        return text

    @staticmethod
    def _render(sections: list[tuple[str, list[str]]], chosen: set[tuple[int, int]]) -> str:
        out: list[str] = []
        for section, (title, items) in enumerate(sections):
            picked = [item for i, item in enumerate(items) if (section, i) in chosen]
            if not picked:
                continue
            missing = len(items) - len(picked)
            out.append(f"{title} ({missing} more not shown):" if missing else f"{title}:")
            out.extend(f"- {item}" for item in picked)
        return "\n".join(out)

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        return self.extract(messages)


# ---------------------------------------------------------------------------------------
# the layer


@frozen
class SummaryApplied(Event):
    """The older part of the history was replaced by a summary."""

    kind: ClassVar[str] = "compaction.summary"
    level: ClassVar[EventLevel] = "info"
    summarized: int = 0
    kept: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summarizer: str = ""
    persisted: bool = False
    source: str = "layer"

    @classmethod
    def of(
        cls,
        stats: SummaryStats,
        summarizer: Summarizer,
        *,
        persisted: bool = False,
        source: str = "layer",
    ) -> SummaryApplied:
        return cls(
            summarized=stats.summarized,
            kept=stats.kept,
            tokens_before=stats.tokens_before,
            tokens_after=stats.tokens_after,
            summarizer=type(summarizer).__name__,
            persisted=persisted,
            source=source,
        )

    def describe(self) -> str | None:
        if self.source != "layer":
            return None  # as a guard policy, the guard's own event reports it
        return f"summary of {self.summarized} -{self.tokens_before - self.tokens_after}"


@frozen
class SummaryFailed(Event):
    """A summary failed; the history is unchanged. ``disabled``: the layer stopped trying."""

    kind: ClassVar[str] = "compaction.summary_failed"
    level: ClassVar[EventLevel] = "warning"
    error: str = ""
    consecutive_failures: int = 0
    disabled: bool = False
    source: str = "layer"

    def describe(self) -> str | None:
        return None if self.source != "layer" else "summary failed"


class _Breaker:
    """Consecutive failures of the layer in one thread (durable per-thread state)."""

    __slots__ = ("failures",)

    def __init__(self) -> None:
        self.failures = 0

    def to_json(self) -> dict[str, Any]:
        return {"failures": self.failures}

    @classmethod
    def from_json(cls, data: Any) -> _Breaker:
        failures = data.get("failures") if isinstance(data, dict) else None
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise ValueError(f"failures must be an integer >= 0, got {failures!r}")
        breaker = cls()
        breaker.failures = failures
        return breaker


def _remap(
    before: tuple[Message, ...], summary: Message
) -> Callable[[tuple[Message, ...]], tuple[tuple[Message, ...], bool] | None]:
    """Replace, in the conversation, the block of summarized messages by the summary.

    The summarized messages must sit there as one block (system messages aside, which are
    kept); otherwise, or if the result would break pairing, nothing maps back.
    """
    gone = {id(m) for m in before if not isinstance(m, SystemMessage)} - {id(summary)}

    def remap(current: tuple[Message, ...]) -> tuple[tuple[Message, ...], bool] | None:
        positions = [i for i, m in enumerate(current) if id(m) in gone]
        if not positions:
            return None
        start, end = positions[0], positions[-1] + 1
        block = current[start:end]
        if len(positions) != sum(1 for m in block if not isinstance(m, SystemMessage)):
            return None
        kept = tuple(m for m in block if isinstance(m, SystemMessage))
        updated = (*current[:start], *kept, summary, *current[end:])
        try:
            check_pairing(updated)
        except PairingError:
            return None
        return updated, True

    return remap


def _tail_within(messages: tuple[Message, ...], budget: int, counter: TokenCounter) -> int:
    """How many of the newest messages fit in ``budget`` tokens (at least one)."""
    count = counter.count_message
    total = kept = 0
    for message in reversed(messages):
        total += count(message)
        if total > budget and kept:
            break
        kept += 1
    return kept


class Summarize(Layer):
    """Summarizes the older history once a request's estimate reaches ``trigger_tokens``.

    ``trigger_tokens=None`` (the default) summarizes only a request that would not fit the
    run's usable window (``RunConfig.max_tokens`` minus reserved output; an error when the
    window is unknown): a summary rewrites the cached prompt prefix, so on a conversation
    that fits the layer never costs more than no management. ``trigger`` says when in
    any of the ways of :mod:`tinyctx.middleware.triggers` instead: tokens, a fraction of the
    window, a message count, AND (a mapping) and OR (a list) of them — LangChain's spellings
    such as ``[("fraction", 0.8), ("messages", 200)]`` work as they are. ``keep`` says how much
    of the newest history stays verbatim: ``("messages", 20)``, ``("tokens", 4000)`` (the
    newest messages that fit, at least one, grown back so no tool call loses its result) or
    ``("fraction", 0.3)`` of the usable window; the default is ``keep_recent`` messages.
    ``persist=True`` (the default) commits the summary to the conversation, so later calls
    start from it and the summary is paid for once; ``persist=False`` rewrites only this
    call's request. A failed summary is reported (``SummaryFailed``) and the call goes on
    with the history as it was; a summary that would not make the history smaller counts as
    a failed one (refused); after ``max_failures`` consecutive failures the layer stops
    trying for the thread (0: never stops; the count is durable thread state, so a later
    session of a thread with a store continues it), and a success resets the count. As a
    pressure policy (``relieve``) it summarizes the least of the head that frees what the
    guard needs (the kept tail is the newest messages that fit once the summary is in),
    whatever the trigger says, reports failure in ``Relief.detail["failed"]``,
    and leaves the history as it was when the summary would not make it smaller.

    ``keep_task=True`` keeps the first user message (the task, when it is at most an eighth
    of the history it fires on, or as a guard's policy of the usable window) verbatim in
    front of the summary. ``keep_summaries=N`` stacks summaries
    instead of folding them: the earlier summaries at the front of the history (after the
    system messages and the kept task) stay verbatim while there are at most ``N`` of them,
    and only what follows them is summarized, into a new summary placed after them; so the
    provider's cached prefix survives through the last summary and each summary rewrites
    less. When there are more than ``N``, the next summary folds them all into one (a single
    bigger rewrite), so at most ``N + 1`` summaries ever stand in front. ``0`` (the default)
    folds every time: each summary replaces the previous one.
    """

    role = "summarize"  # its place in a BudgetGuard's policy order
    breaker_group: str | None = "summarize"  # a guard's circuit breaker counts its failures

    def __init__(
        self,
        summarizer: Summarizer,
        trigger_tokens: int | None = None,
        keep_recent: int = 10,
        persist: bool = True,
        counter: TokenCounter | None = None,
        *,
        trigger: Any = None,
        keep: Any = None,
        max_failures: int = 3,
        keep_task: bool = False,
        keep_summaries: int = 0,
        name: str | None = None,
    ) -> None:
        owner = type(self).__name__
        if not isinstance(summarizer, Summarizer):
            raise ConfigError(
                "summarizer",
                summarizer,
                "an object with async summarize(messages, ctx) -> str",
                owner=owner,
            )
        self.summarizer = summarizer
        self.trigger_tokens = (
            None
            if trigger_tokens is None
            else check_int(trigger_tokens, "trigger_tokens", owner, minimum=1)
        )
        if trigger is not None and trigger_tokens is not None:
            raise ConfigError(
                "trigger_tokens",
                trigger_tokens,
                "None when trigger is given (trigger_tokens=N is trigger=N)",
                owner=owner,
            )
        self.trigger: Trigger | None = None if trigger is None else as_trigger(trigger, owner=owner)
        self.keep_recent = check_int(keep_recent, "keep_recent", owner)
        if keep is not None and keep_recent != 10:
            raise ConfigError(
                "keep_recent", keep_recent, "10 (the default) when keep is given", owner=owner
            )
        self.keep: Keep = as_keep(keep_recent if keep is None else keep, owner=owner)
        if self.keep.kind == "messages":
            self.keep_recent = int(self.keep.value)
        self.persist = check_bool(persist, "persist", owner)
        self.counter = check_counter(counter, owner)
        self.max_failures = check_int(max_failures, "max_failures", owner)
        self.keep_task = check_bool(keep_task, "keep_task", owner)
        self.keep_summaries = check_int(keep_summaries, "keep_summaries", owner)
        if name is not None:
            self.name = name

    def fires(self, request: ModelRequest, ctx: RunContext[Any], counter: TokenCounter) -> bool:
        """Whether this request reaches the trigger (``trigger``, else ``trigger_tokens``,
        else one token over the usable window)."""
        if self.trigger is not None:
            return self.trigger.fires(
                counter.count_request(request),
                len(request.messages),
                ctx.config.usable_tokens,
                type(self).__name__,
            )
        return counter.count_request(request) >= self.trigger_for(ctx)

    def keep_for(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: TokenCounter
    ) -> int:
        """How many of the newest messages stay verbatim: ``keep`` in messages, or as many
        newest messages as fit its token budget (at least one)."""
        budget = self.keep.tail_tokens(ctx.config.usable_tokens, type(self).__name__)
        if budget is None:
            return self.keep_recent
        return _tail_within(messages, budget, counter)

    def _keep_for_need(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        need: int,
        kept_head: int,
    ) -> int:
        """As a guard's policy: keep the newest messages that leave the history ``need``
        tokens smaller once the summary (``max_tokens`` of the summarizer, else 1024, and its
        heading) is in, besides the ``kept_head`` leading messages; at least one message.
        ``need <= 0``: the layer's own ``keep``."""
        if need <= 0:
            return self.keep_for(messages, ctx, counter)
        allowance = getattr(self.summarizer, "max_tokens", None)
        if not isinstance(allowance, int) or isinstance(allowance, bool) or allowance <= 0:
            allowance = 1024
        allowance += counter.count_text(SUMMARY_PREFIX) + 8  # the heading and its count
        head = counter.count_messages(messages[:kept_head])
        room = counter.count_messages(messages) - need - allowance - head
        return _tail_within(messages, room, counter)

    def _pins_task(
        self, messages: tuple[Message, ...], counter: TokenCounter, room: int | None = None
    ) -> bool:
        """Whether the first user message stays in front of the summary (see
        :meth:`_keeps_task`)."""
        return self._keeps_task(messages, counter, room) > _system_lead(messages)

    def _keeps_task(
        self, messages: tuple[Message, ...], counter: TokenCounter, room: int | None = None
    ) -> int:
        """How many leading messages stay in front of the summary: the system messages,
        and with ``keep_task`` the first user message when it is at most an eighth of
        ``room`` (a long one is summarized like the rest) or was kept in front of an
        earlier summary (it stays there, and so does the cached prefix up to it).

        ``room`` is the history, where the layer fires on its own trigger: a task kept
        there never leaves the history near a low trigger after the summary. A guard's
        relief passes the usable window: the guard's earlier policies (microcompaction)
        shrink the history first, and a task measured against what is left of it was
        summarized alone, which rewrote the prompt from the task on, where keeping it
        leaves the system prompt and the task a cached prefix that survives every later
        relief."""
        lead = _system_lead(messages)
        if not self.keep_task or lead >= len(messages):
            return lead
        first = messages[lead]
        if not _may_be_task(first):
            return lead
        kept_before = lead + 1 < len(messages) and is_summary(messages[lead + 1])
        if room is None:
            room = counter.count_messages(messages)
        if not kept_before and counter.count_message(first) * 8 > room:
            return lead
        return lead + 1

    def _stack_for_need(
        self, messages: tuple[Message, ...], counter: TokenCounter, need: int, room: int | None
    ) -> tuple[int, int]:
        """As a guard's policy: ``(keep_summaries, kept_head)`` for this relief. The earlier
        summaries stay in front (``keep_summaries``, when there are at most that many) only
        while they take at most half of what the relief leaves (the history less ``need``);
        else this summary folds them all in (``0``), so they never crowd out the recent
        tail. ``kept_head`` counts the leading messages left in front of the summary."""
        lead = self._keeps_task(messages, counter, room)
        stacked = _stack(messages, lead, self.keep_summaries)[0]
        if stacked == lead:
            return self.keep_summaries, lead
        left = counter.count_messages(messages) - max(need, 0)
        if counter.count_messages(messages[lead:stacked]) * 2 > left:
            return 0, lead
        return self.keep_summaries, stacked

    def trigger_for(self, ctx: RunContext[Any]) -> int:
        """The token estimate at which this layer summarizes, for ``ctx``'s window
        (``trigger_tokens``, else one token over the usable window: a request that would
        not fit)."""
        if self.trigger_tokens is not None:
            return self.trigger_tokens
        usable = ctx.config.usable_tokens
        if usable is None:
            raise ConfigError(
                "trigger_tokens",
                None,
                "an integer >= 1, or None only when RunConfig.max_tokens is set",
                owner=type(self).__name__,
            )
        return usable + 1

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if self.trigger is None:
            self.trigger_for(ctx)  # an unknown window is an error on every call, not just some
        breaker = ctx.thread_state(self, _Breaker)
        if self.max_failures and breaker.failures >= self.max_failures:
            return await call_next(request, ctx)
        counter = self.counter or default_counter()
        if not self.fires(request, ctx, counter):
            return await call_next(request, ctx)
        messages = request.messages
        try:
            new, stats = await summarize_history(
                messages,
                self.summarizer,
                ctx,
                self.keep_for(messages, ctx, counter),
                counter=counter,
                keep_task=self._pins_task(messages, counter),
                keep_summaries=self.keep_summaries,
            )
            if stats.changed and stats.tokens_freed <= 0:
                raise SummarizationError(
                    f"the summary of {stats.summarized} messages would not shrink the history "
                    f"({stats.tokens_before} tokens before, {stats.tokens_after} after); refused"
                )
        except SummarizationError as exc:
            breaker.failures += 1
            ctx.emit(
                SummaryFailed(
                    error=str(exc),
                    consecutive_failures=breaker.failures,
                    disabled=bool(self.max_failures) and breaker.failures >= self.max_failures,
                )
            )
            return await call_next(request, ctx)
        breaker.failures = 0
        if not stats.changed:
            return await call_next(request, ctx)
        persisted = False
        if self.persist:
            summary = new[len(new) - (len(messages) - stats.split) - 1]
            replaced = messages[stats.lead : stats.split]
            persisted, new = commit(ctx, messages, new, _remap(replaced, summary))
            if persisted:
                ctx.conversation.add_message_event(summary)
        ctx.emit(SummaryApplied.of(stats, self.summarizer, persisted=persisted))
        return await call_next(request.evolve(messages=new), ctx)

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        keep_summaries, head = self._stack_for_need(
            messages, counter, need, ctx.config.usable_tokens
        )
        try:
            new, stats = await summarize_history(
                messages,
                self.summarizer,
                ctx,
                self._keep_for_need(messages, ctx, counter, need, head),
                counter=counter,
                keep_task=self._pins_task(messages, counter, ctx.config.usable_tokens),
                forward=need > 0,
                keep_summaries=keep_summaries,
            )
        except SummarizationError as exc:
            ctx.emit(SummaryFailed(error=str(exc), source="policy"))
            return Relief(messages, 0, {"failed": True, "error": str(exc)}, error=str(exc))
        detail = {
            "failed": False,
            "summarized": stats.summarized,
            "kept": stats.kept,
            "tokens_before": stats.tokens_before,
            "tokens_after": stats.tokens_after,
        }
        if not stats.changed or stats.tokens_freed <= 0:
            return Relief(messages, 0, {**detail, "applied": False})
        ctx.emit(SummaryApplied.of(stats, self.summarizer, source="policy"))
        return Relief(new, stats.tokens_freed, {**detail, "applied": True})
