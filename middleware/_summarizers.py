"""The two built-in summarizers: one that asks a model, one that extracts without a model."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tinyctx import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolResult,
    UserMessage,
)
from tinyctx.config import Check, function
from tinyctx.conversation import Conversation
from tinyctx.events import ModelCallFinished
from tinyctx.model import ModelHandler
from tinyctx.parts import TextPart, describe_part
from tinyctx.tokens import TokenCounter, default_counter

from ._compaction import (
    check_counter,
    check_int,
    tinyctx_meta,
)
from ._summary_history import (
    DEFAULT_SUMMARY_PROMPT,
    _arguments,
    _middle_cut,
    _squash,
    is_summary,
    render_transcript,
)

_PROMPT: Check[str] = Check(
    lambda value: isinstance(value, str) and bool(value.strip()), "a non-empty string"
)


class ModelSummarizer:
    """Asks a model for a dense summary, through the ``call_model`` signature.

    ``model`` is any model handler ``async (request, ctx) -> ModelResponse`` (a provider
    adapter, an agent's model or a whole onion). It is called with a child context
    (``ctx.derive``, tagged ``tinyctx:summarize``, with its own conversation), no tools, and
    one user message holding the transcript; its usage is added to the run's trackers.
    The transcript is capped at ``max_transcript_tokens`` (and at 3/4 of the run's usable
    window when that is known), dropping messages from the middle.

    Args:
        model: The model handler asked for the summary.
        model_name: The model of the summary request; default the run's.
        prompt: The instruction in front of the transcript.
        max_transcript_tokens: The most the transcript takes.
        settings: Provider settings of the summary request.
        counter: Counts the transcript; default :func:`~tinyctx.tokens.default_counter`.
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
        function(allowed="an async model handler").check(model, "model", "ModelSummarizer")
        _PROMPT.check(prompt, "prompt", "ModelSummarizer")
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

    Args:
        max_tokens: The longest summary.
        line_chars: The longest line kept of a goal, statement or result.
        statements: How many of the last assistant statements are kept.
        counter: Counts the summary; default :func:`~tinyctx.tokens.default_counter`.
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
