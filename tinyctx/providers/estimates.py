"""Provider-side context management estimated locally, for ``tinyctx replay --stack``.

A replay has no provider to do the clearing, so these layers apply the provider's
documented rule (:mod:`tinyctx.providers.clearing`) to each request themselves, and say
so: every event they emit carries ``estimated=True`` and its text starts ``estimate:``
(the replay table's actions), and the replay JSON lists them under
``summary.estimated_by``. Compare a provider-side stack with tinyctx's own on the same
transcript::

    tinyctx replay --window 200000 --stack anthropic-estimate --json
    tinyctx replay --window 200000 --stack default --json

- :class:`AnthropicContextEditingEstimate`: ``clear_tool_uses_20250919``, as
  :class:`~tinyctx.providers.anthropic_context.AnthropicContextEditing` asks for it; the
  server edits its copy of each request, so the thread is unchanged.
- :class:`AnthropicCompactionEstimate`: ``compact_20260112``, as
  :class:`~tinyctx.providers.anthropic_compaction.AnthropicCompaction` asks for it and maps
  it into the thread; the summary is a stand-in of ``summary_tokens`` (the provider's
  summary length is not documented).
- :class:`ResponsesCompactEstimate`: OpenAI's ``responses.compact`` as
  :class:`~tinyctx.providers.openai_compact.ResponsesCompact` runs it (its user messages
  kept, the opaque compaction a stand-in of ``summary_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..chain import Layer, LayerLike, ModelCall
from ..config import integer
from ..context import RunContext
from ..messages import AssistantMessage
from ..model import ModelRequest, ModelResponse
from ..ordering import Outside
from ..tokens import TokenCounter, default_counter
from .anthropic_compaction import AnthropicCompaction
from .anthropic_context import CLEAR_TOOL_USES, AnthropicContextEditing, ProviderContextEdited
from .clearing import Compaction, ProviderCompacted, is_conversation

__all__ = [
    "AnthropicContextEditingEstimate",
    "AnthropicCompactionEstimate",
    "ResponsesCompactEstimate",
    "anthropic_estimate_stack",
    "stand_in_summary",
]

_FILLER: Final = "summary "
_AT_LEAST_ONE = integer(minimum=1)
_AT_LEAST_ZERO = integer(minimum=0)


def stand_in_summary(tokens: int, counter: TokenCounter) -> str:
    """A text of about ``tokens`` tokens by ``counter``, standing for a provider's summary."""
    per_unit = max(1.0, (counter.count_text(_FILLER * 200) - counter.count_text(_FILLER)) / 199)
    return "[estimate: provider summary] " + _FILLER * max(0, round(tokens / per_unit))


class AnthropicContextEditingEstimate(AnthropicContextEditing):
    """Applies ``clear_tool_uses_20250919`` locally to each request (see the module doc);
    ``options`` are :class:`AnthropicContextEditing`'s, checked the same way."""

    def __init__(self, *, counter: TokenCounter | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.counter = counter or default_counter()

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        edited, uses, freed = self.rule.edit(request, self.counter)
        if uses:
            ctx.emit(
                ProviderContextEdited,
                layer=self.name,
                edit=CLEAR_TOOL_USES,
                cleared_tool_uses=uses,
                freed_tokens=freed,
                estimated=True,
            )
            request = request.evolve(messages=edited)
        return await call_next(request, ctx)


class AnthropicCompactionEstimate(Layer):
    """Applies ``compact_20260112`` locally once a request passes the trigger (see the
    module doc); the arguments are :class:`AnthropicCompaction`'s, checked the same way."""

    def __init__(
        self,
        *,
        trigger_tokens: int = 150_000,
        summary_tokens: int = 2_000,
        counter: TokenCounter | None = None,
    ) -> None:
        self.counter = counter or default_counter()
        self.compaction = AnthropicCompaction(
            trigger_tokens=trigger_tokens, summary_tokens=summary_tokens, counter=self.counter
        )
        self.compaction.name = self.name

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        rule = self.compaction.rule
        if rule.cleared(request, self.counter) > 0:
            summary = stand_in_summary(rule.summary_tokens, self.counter)
            after = self.compaction.record(request, summary, ctx, estimated=True)
            request = request.evolve(messages=after)
        return await call_next(request, ctx)


class ResponsesCompactEstimate(Layer):
    """OpenAI's ``responses.compact`` applied locally once a request reaches
    ``trigger_tokens``, as :class:`~tinyctx.providers.openai_compact.ResponsesCompact` runs
    it: the head (all but the newest ``keep_recent`` messages, no call parted from its
    result) becomes its user messages and one opaque compaction, here a stand-in assistant
    message of ``summary_tokens``; committed to the conversation."""

    constraints = (Outside("BudgetGuard", reason="the guard measures what it compacted"),)

    def __init__(
        self,
        *,
        trigger_tokens: int,
        keep_recent: int = 10,
        summary_tokens: int = 2_000,
        counter: TokenCounter | None = None,
    ) -> None:
        owner = type(self).__name__
        self.rule = Compaction(
            trigger=_AT_LEAST_ONE.check(trigger_tokens, "trigger_tokens", owner),
            summary_tokens=_AT_LEAST_ZERO.check(summary_tokens, "summary_tokens", owner),
            keep_recent=_AT_LEAST_ZERO.check(keep_recent, "keep_recent", owner),
            keep_user_messages=True,
        )
        self.counter = counter or default_counter()

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        rule, counter = self.rule, self.counter
        if rule.cleared(request, counter) <= 0:
            return await call_next(request, ctx)
        messages = request.messages
        cut = rule.split(messages)
        kept = rule.kept(messages[:cut])
        compaction = AssistantMessage(stand_in_summary(rule.summary_tokens, counter))
        after = (*kept, compaction, *messages[cut:])
        persisted = is_conversation(messages, ctx)
        if persisted:
            ctx.conversation.replace(after, emit_new=False)
        compacted = request.evolve(messages=after)
        before, tokens_after = counter.count_request(request), counter.count_request(compacted)
        ctx.emit(
            ProviderCompacted,
            provider="openai",
            layer=self.name,
            messages_before=cut,
            messages_after=len(kept) + 1,
            tokens_before=before,
            tokens_after=tokens_after,
            freed_tokens=max(0, before - tokens_after),
            persisted=persisted,
            estimated=True,
        )
        return await call_next(compacted, ctx)


def anthropic_estimate_stack(counter: TokenCounter | None = None) -> Sequence[LayerLike]:
    """Anthropic's server-side compaction and tool-result clearing at their documented
    defaults (150,000 and 100,000 input tokens, keep 3 tool uses), estimated locally."""
    return [
        AnthropicCompactionEstimate(counter=counter),
        AnthropicContextEditingEstimate(counter=counter),
    ]
