"""Anthropic's server-side compaction (``compact_20260112``) as a layer.

``AnthropicCompaction(trigger_tokens=150_000)`` in the middleware of an agent whose model
is an :class:`~tinyctx.providers.anthropic.AnthropicModel` asks the API to compact the
conversation once the prompt passes ``trigger_tokens`` (at least 50,000, as the API
requires): each wrapped call carries the ``compact_20260112`` edit and the
``compact-2026-01-12`` beta header (merged with the request's by the Anthropic adapter
alone, as for :class:`~tinyctx.providers.anthropic_context.AnthropicContextEditing`: a
fallback to another provider sends neither).

When the server compacts, the answer starts with a ``compaction`` block holding its summary
of everything before it, and the API drops every block before that one from later
requests. The layer maps it into the thread as tinyctx's own compaction does: the
messages the server summarized are replaced, in the conversation, by one user message
holding the summary (marked ``metadata["tinyctx"]["summary"]``), committed with
``emit_new=False`` so the store archives the originals. The answer keeps the compaction
block (sent back verbatim: the server drops the summary message before it), so the thread
stays valid for Anthropic, and another provider reads the summary as text. The event
``compaction.provider`` (:class:`~tinyctx.providers.clearing.ProviderCompacted`) says
what was replaced, and what the server's compaction step cost (``provider_input_tokens``,
``provider_output_tokens``: billed, but outside the response's top-level usage).

The layer sits outside the budget guard and declares its rule on the requests it passes
in (:mod:`tinyctx.providers.clearing`): the guard does not compact what the server will.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..chain import Layer, ModelCall
from ..config import flag, integer, optional, text
from ..context import RunContext
from ..messages import Message, SystemMessage, UserMessage
from ..model import ModelRequest, ModelResponse
from ..ordering import Outside
from ..tokens import TokenCounter, default_counter
from .anthropic_context import request_edit
from .clearing import Compaction, ProviderCompacted, declare, is_conversation

__all__ = [
    "AnthropicCompaction",
    "COMPACTION_BETA",
    "COMPACT_EDIT",
    "compaction_summary",
    "compaction_usage",
]

COMPACTION_BETA: Final = "compact-2026-01-12"
COMPACT_EDIT: Final = "compact_20260112"
MIN_TRIGGER: Final = 50_000
"""The smallest trigger the API accepts."""
SUMMARY_PREFIX: Final = "[auto-compacted] Summary of {count} earlier messages:"
_OWNER: Final = "AnthropicCompaction"
_TRIGGER = integer(minimum=MIN_TRIGGER)
_SUMMARY_TOKENS = integer(minimum=0)
_INSTRUCTIONS = optional(text(), allowed="None or non-empty summarization instructions")
_FLAG = flag()


def compaction_summary(message: Message) -> str | None:
    """The summary of the last ``compaction`` block an Anthropic answer carries, if any
    (a block with no content is a failed compaction, which the server ignores)."""
    own = message.metadata.get("anthropic")
    blocks = own.get("content") if isinstance(own, Mapping) else None
    if not isinstance(blocks, Sequence) or isinstance(blocks, str):
        return None
    summaries = [
        block["content"]
        for block in blocks
        if isinstance(block, Mapping)
        and block.get("type") == "compaction"
        and isinstance(block.get("content"), str)
        and block["content"]
    ]
    return summaries[-1] if summaries else None


class AnthropicCompaction(Layer):
    """Turns on Anthropic's server-side compaction for the calls it wraps and maps each
    compaction into the thread (see the module docstring).

    Args:
        trigger_tokens: the prompt size (input tokens, >= 50,000) at which the server
            compacts.
        instructions: extra summarization instructions for the server, or None.
        summary_tokens: the summary size the budget guard assumes (the server's is not
            documented; an estimate).
        persist: commit the compaction to the conversation (the originals archived).
        counter: counts the tokens the event reports (the default counter when None).
    """

    constraints = (Outside("BudgetGuard", reason="the guard reads the rule it declares"),)

    def __init__(
        self,
        *,
        trigger_tokens: int = 150_000,
        instructions: str | None = None,
        summary_tokens: int = 2_000,
        persist: bool = True,
        counter: TokenCounter | None = None,
    ) -> None:
        trigger = _TRIGGER.check(trigger_tokens, "trigger_tokens", _OWNER)
        self.edit: dict[str, Any] = {
            "type": COMPACT_EDIT,
            "trigger": {"type": "input_tokens", "value": trigger},
        }
        if _INSTRUCTIONS.check(instructions, "instructions", _OWNER) is not None:
            self.edit["instructions"] = instructions
        self.rule = Compaction(
            trigger=trigger,
            summary_tokens=_SUMMARY_TOKENS.check(summary_tokens, "summary_tokens", _OWNER),
        )
        self.persist = _FLAG.check(persist, "persist", _OWNER)
        self.counter = counter or default_counter()

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        edited = request_edit(declare(request, self.rule), self.edit, COMPACTION_BETA)
        response = await call_next(edited, ctx)
        summary = compaction_summary(response.message)
        if summary is not None:
            self.record(request, summary, ctx, usage=compaction_usage(response.raw))
        return response

    def record(
        self,
        request: ModelRequest,
        summary: str,
        ctx: RunContext[Any],
        *,
        usage: tuple[int, int] = (0, 0),
        estimated: bool = False,
    ) -> tuple[Message, ...]:
        """Replace the messages the server summarized by ``summary`` (in the conversation
        when the request was the conversation itself; else the thread keeps them, and the
        server drops them anyway); returns the compacted history. ``usage``: the input and
        output tokens of the server's compaction step; ``estimated``: the summary is a
        local stand-in (:mod:`tinyctx.providers.estimates`)."""
        messages = request.messages
        system = tuple(m for m in messages if isinstance(m, SystemMessage))
        replaced = len(messages) - len(system)
        record = UserMessage(
            f"{SUMMARY_PREFIX.format(count=replaced)}\n{summary}",
            metadata={"tinyctx": {"summary": {"messages": replaced, "summarizer": COMPACT_EDIT}}},
        )
        after = (*system, record)
        persisted = self.persist and is_conversation(messages, ctx)
        if persisted:
            ctx.conversation.replace(after, emit_new=False)
        before = self.counter.count_request(request)
        tokens_after = self.counter.count_request(request.evolve(messages=after))
        ctx.emit(
            ProviderCompacted,
            provider="anthropic",
            layer=self.name,
            messages_before=replaced,
            messages_after=1,
            tokens_before=before,
            tokens_after=tokens_after,
            freed_tokens=max(0, before - tokens_after),
            persisted=persisted,
            estimated=estimated,
            provider_input_tokens=usage[0],
            provider_output_tokens=usage[1],
        )
        return after


def compaction_usage(raw: object) -> tuple[int, int]:
    """The input and output tokens of the compaction steps an Anthropic response reports
    in ``usage.iterations``: billed, but not in the top-level usage (nor, so, in the
    call's :class:`~tinyctx.model.Usage`)."""
    iterations = getattr(getattr(raw, "usage", None), "iterations", None)
    spent = [0, 0]
    for entry in iterations or ():
        data = entry if isinstance(entry, Mapping) else getattr(entry, "__dict__", {})
        if data.get("type") == "compaction":
            for i, key in enumerate(("input_tokens", "output_tokens")):
                value = data.get(key)
                spent[i] += value if isinstance(value, int) else 0
    return spent[0], spent[1]
