"""LangChain's summarization and context-editing middleware driven inside a tinyctx replay
(the peer of ``bench_cost``), at settings matched to tinyctx's: one token counter counts
everyone and unchanged messages map to the very same objects both ways."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from tinyctx import (
    AssistantMessage,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.chain import LayerLike
from tinyctx.frozen import thaw
from tinyctx.middleware import ExtractiveSummarizer
from tinyctx.tokens import TokenCounter

RESERVE = 4_000
"""Tokens kept free for the answer: the usable window is the window less this."""
TRIGGER = 0.9
"""LangChain's trigger: this share of the usable window."""


class _Bridge:
    """tinyctx <-> LangChain messages, memoized both ways so that unchanged messages map to
    the very same objects (a cached prefix stays equal) and one counter counts everyone."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.to_lc: dict[int, tuple[Message, Any]] = {}
        self.from_lc: dict[int, tuple[Any, Message]] = {}

    def lc(self, message: Message) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langchain_core.messages import SystemMessage as LCSystem

        known = self.to_lc.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        out: Any
        if isinstance(message, AssistantMessage):
            calls = [
                {"name": c.name, "args": thaw(c.arguments), "id": c.id} for c in message.tool_calls
            ]
            out = AIMessage(content=message.content, tool_calls=calls)
        elif isinstance(message, ToolResult):
            out = ToolMessage(content=message.text, tool_call_id=message.tool_call_id)
        elif isinstance(message, SystemMessage):
            out = LCSystem(content=message.content)
        else:
            out = HumanMessage(content=message.text)
        self.to_lc[id(message)] = (message, out)
        self.from_lc[id(out)] = (out, message)
        return out

    def back(self, message: Any) -> Message:
        from langchain_core.messages import AIMessage, ToolMessage
        from langchain_core.messages import SystemMessage as LCSystem

        known = self.from_lc.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        out: Message
        if isinstance(message, AIMessage):
            calls = tuple(
                ToolCall(str(c["id"]), c["name"], c.get("args") or {}) for c in message.tool_calls
            )
            out = AssistantMessage(str(message.content), calls)
        elif isinstance(message, ToolMessage):
            out = ToolResult(message.tool_call_id, str(message.content))
        elif isinstance(message, LCSystem):
            out = SystemMessage(str(message.content))
        else:
            out = UserMessage(str(message.content))
        self.from_lc[id(message)] = (message, out)
        self.to_lc[id(out)] = (out, message)
        return out

    def count(self, messages: Sequence[Any]) -> int:
        return self.counter.count_messages(tuple(self.back(m) for m in messages))


class LangChainSummarization(Layer):
    """``SummarizationMiddleware.before_model`` on the conversation, committed to it (as
    LangChain's ``RemoveMessage(REMOVE_ALL)`` update does)."""

    name = "langchain-summarization"

    def __init__(self, bridge: _Bridge, trigger: Any, keep: Any, summary_tokens: int) -> None:
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.language_models.fake_chat_models import FakeListChatModel

        self.bridge = bridge
        extractive = ExtractiveSummarizer(max_tokens=summary_tokens, counter=bridge.counter)

        def summarize(messages: list[Any]) -> str:
            return extractive.extract([bridge.back(m) for m in messages])

        self.middleware = SummarizationMiddleware(
            FakeListChatModel(responses=["unused"]),
            trigger=trigger,
            keep=keep,
            token_counter=bridge.count,
            summarizer=summarize,
            trim_tokens_to_summarize=None,
        )

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        lc = [self.bridge.lc(m) for m in request.messages]
        update = self.middleware.before_model({"messages": lc}, None)  # type: ignore[arg-type]
        if update is None:
            return await call_next(request, ctx)
        new = tuple(self.bridge.back(m) for m in update["messages"][1:])
        ctx.conversation.replace(new, emit_new=False)
        return await call_next(request.evolve(messages=ctx.conversation.messages), ctx)


class LangChainContextEditing(Layer):
    """``ContextEditingMiddleware``: a deep copy of the request edited on every call
    (transient, as LangChain does)."""

    name = "langchain-context-editing"

    def __init__(self, bridge: _Bridge, **edit: Any) -> None:
        from langchain.agents.middleware import ClearToolUsesEdit

        self.bridge = bridge
        self.edit = ClearToolUsesEdit(**edit)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        original = [self.bridge.lc(m) for m in request.messages]
        edited = copy.copy(original)  # the edit replaces entries, it never mutates them
        self.edit.apply(edited, count_tokens=self.bridge.count)
        if all(a is b for a, b in zip(edited, original, strict=True)):
            return await call_next(request, ctx)
        messages = tuple(self.bridge.back(m) for m in edited)
        return await call_next(request.evolve(messages=messages), ctx)


def langchain_stack(
    counter: TokenCounter,
    window: int,
    low_water: float,
    *,
    editing: bool,
    summary: bool,
    trigger: float = TRIGGER,
) -> list[LayerLike]:
    """LangChain's pair at ``trigger`` (a fraction of the usable window; 1.0: only a
    request that would not fit, as tinyctx's defaults) keeping ``low_water`` of it."""
    usable = window - RESERVE
    at = int(trigger * usable) + (1 if trigger >= 1 else 0)
    bridge = _Bridge(counter)
    layers: list[LayerLike] = []
    if summary:
        layers.append(
            LangChainSummarization(
                bridge,
                trigger=("tokens", at),
                keep=("tokens", int(low_water * usable)),
                summary_tokens=1000,
            )
        )
    if editing:
        layers.append(LangChainContextEditing(bridge, trigger=at, keep=5, clear_at_least=0))
    return layers


def langchain_available() -> bool:
    try:
        import langchain.agents.middleware  # noqa: F401
    except ImportError:
        return False
    return True
