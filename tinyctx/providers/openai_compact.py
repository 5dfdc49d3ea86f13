"""OpenAI's server-side compaction (``responses.compact``) as a tinyctx layer.

``ResponsesCompact(model, trigger_tokens=...)`` sits in the middleware of an agent whose
model is an :class:`~tinyctx.providers.openai_responses.OpenAIResponsesModel`. When a
request's estimate reaches ``trigger_tokens`` it sends the head of the history (all but
the newest ``keep_recent`` messages, cut where no call is parted from its result) to
``client.responses.compact`` and puts what comes back in its place: the user messages the
provider keeps, then one assistant message holding the opaque ``compaction`` item (its
``encrypted_content`` is the provider's summary of everything else). The adapter sends
that item back verbatim on every later call.

With ``persist=True`` (the default) the rewrite is committed to the conversation
(``emit_new=False``: the store records it as a compaction, the replaced messages kept for
audit), so the compacted prefix stays stable for the prompt cache. The event
``compaction.provider`` says how many messages and tokens the provider took. The layer
sits outside the budget guard (a declared ordering rule): its compaction is done before
the guard measures, so the guard acts only when the provider's compaction was not enough.

The compaction item is only readable by OpenAI: a thread compacted this way has no text
for the messages it replaced, so a fallback to another provider sees only the kept user
messages and the recent turns.
"""

from __future__ import annotations

from typing import Any, Final

import openai

from ..chain import Layer, ModelCall
from ..config import flag, implements, integer
from ..context import RunContext
from ..errors import ConfigError, TinyCtxError
from ..formats import FormatError
from ..messages import AssistantMessage, Message, snap_boundary
from ..model import ModelRequest, ModelResponse
from ..ordering import Outside
from ..tokens import REASONING_TOKENS, TokenCounter, default_counter
from ._base import unreadable
from ._responses_items import ITEMS, RESPONSES, from_responses_input, to_responses_input
from .clearing import ProviderCompacted, is_conversation
from .openai import openai_error
from .openai_responses import OpenAIResponsesModel

__all__ = ["ResponsesCompact", "ProviderCompacted", "COMPACTION_ITEM"]

COMPACTION_ITEM: Final = "compaction"
_OWNER: Final = "ResponsesCompact"


def _check_int(value: object, field: str, minimum: int) -> int:
    return integer(minimum=minimum).check(value, field, _OWNER)


class ResponsesCompact(Layer):
    """Compacts the history on OpenAI's side when a request reaches ``trigger_tokens``
    (see the module docstring)."""

    constraints = (Outside("BudgetGuard", reason="the guard measures what it compacted"),)

    def __init__(
        self,
        model: OpenAIResponsesModel,
        *,
        trigger_tokens: int,
        keep_recent: int = 10,
        persist: bool = True,
        counter: TokenCounter | None = None,
    ) -> None:
        implements(OpenAIResponsesModel, allowed="an OpenAIResponsesModel").check(
            model, "model", _OWNER
        )
        flag().check(persist, "persist", _OWNER)
        self.model = model
        self.trigger_tokens = _check_int(trigger_tokens, "trigger_tokens", 1)
        self.keep_recent = _check_int(keep_recent, "keep_recent", 0)
        self.persist = persist
        self.counter = counter or default_counter()

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        before = self.counter.count_request(request)
        messages = request.messages
        cut = snap_boundary(messages, len(messages) - self.keep_recent)
        if before < self.trigger_tokens or cut == 0:
            return await call_next(request, ctx)
        head = await self._compact(request, messages[:cut], ctx)
        after = (*head, *messages[cut:])
        persisted = self.persist and is_conversation(messages, ctx)
        if persisted:
            ctx.conversation.replace(after, emit_new=False)
        compacted = request.evolve(messages=after)
        tokens_after = self.counter.count_request(compacted)
        ctx.emit(
            ProviderCompacted,
            messages_before=cut,
            messages_after=len(head),
            tokens_before=before,
            tokens_after=tokens_after,
            freed_tokens=max(0, before - tokens_after),
            persisted=persisted,
        )
        return await call_next(compacted, ctx)

    async def _compact(
        self, request: ModelRequest, head: tuple[Message, ...], ctx: RunContext[Any]
    ) -> tuple[Message, ...]:
        """The provider's compaction of ``head``: its kept user messages, then one
        assistant message carrying the compaction item (counted by its output tokens)."""
        try:
            items = to_responses_input(head)
        except FormatError as exc:
            raise ConfigError("request.messages", None, exc.reason, owner=_OWNER) from exc
        params: dict[str, Any] = {"model": request.model or self.model.model, "input": items}
        if request.system_prompt:
            params["instructions"] = request.system_prompt
        try:
            with ctx.cancellation.linked_scope("model_call"):
                compacted = await self.model.client.responses.compact(**params)
        except openai.OpenAIError as exc:
            raise openai_error(exc) from exc
        # the SDK reads the kept user messages as output messages: the items as they came
        output = [
            item.to_dict(mode="json", exclude_none=True, warnings=False)
            for item in compacted.output
        ]
        if not any(item.get("type") == COMPACTION_ITEM for item in output):
            raise TinyCtxError(f"{_OWNER}: the compacted response holds no compaction item")
        try:
            messages = list(from_responses_input(output))
        except FormatError as exc:
            raise unreadable("openai", exc) from exc
        tokens = compacted.usage.output_tokens if compacted.usage is not None else 0
        for index, message in enumerate(messages):
            own = message.metadata.get(RESPONSES, None)
            kept = own.get(ITEMS, ()) if own is not None else ()
            if isinstance(message, AssistantMessage) and any(
                item.get("type") == COMPACTION_ITEM for item in kept
            ):
                metadata = {**message.metadata, "tinyctx": {REASONING_TOKENS: tokens}}
                messages[index] = message.evolve(metadata=metadata)
        return tuple(messages)
