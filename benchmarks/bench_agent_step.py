"""One whole agent step, tinyctx next to LangChain's ``create_agent``, in the same run.

- per-layer overhead inside a step: N no-op layers (tinyctx ``Layer`` / LangChain
  ``AgentMiddleware.awrap_model_call``), N = 0, 4, 8; the step is one model call that
  answers at once;
- one step with a full stack on a real 100-message history: call limits, retry,
  microcompaction, summarization, tool-result budget and the budget guard (all below their
  triggers, as in the common case), against LangChain's ModelCallLimit, ToolCallLimit,
  ModelRetry, ContextEditing (ClearToolUsesEdit) and Summarization middleware. Warm: every
  step sends the same message objects, so tinyctx's token memo answers; cold: every step
  gets a fresh copy of the history (decoded from its encoding off the clock, as a thread
  loaded from a store is), so every count starts from nothing. LangChain recomputes from
  scratch on every step either way; both rows have their own ratio.

Both sides run on asyncio (LangChain's loop); the fake models answer instantly, so what is
measured is the framework. Without the ``bench`` extra only the tinyctx side is printed.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, print_table

from tinyctx import (
    Agent,
    AssistantMessage,
    EventSink,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    ToolResult,
    UserMessage,
)
from tinyctx.cli import bundled_transcript
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.formats import load_transcript
from tinyctx.middleware import (
    BudgetGuard,
    CallLimits,
    ExtractiveSummarizer,
    Microcompact,
    Retry,
    Summarize,
    ToolResultBudget,
)

ANSWER = ModelResponse(AssistantMessage("ok"))


async def instant_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ANSWER


class Noop(Layer):
    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)


def history_100() -> tuple[Message, ...]:
    """The first 100 messages of the bundled real session, ending on a complete tool turn."""
    messages = load_transcript(bundled_transcript())
    cut = 100
    while cut < len(messages) and isinstance(messages[cut], ToolResult):
        cut += 1
    return tuple(messages[:cut])


def tinyctx_full_stack() -> list[Any]:
    return [
        CallLimits(model_calls=10_000, tool_calls=10_000),
        Retry(attempts=3),
        Microcompact(trigger=100_000),
        Summarize(ExtractiveSummarizer(), trigger_tokens=180_000),
        ToolResultBudget(),
        BudgetGuard(max_tokens=200_000),
    ]


async def _tinyctx_step(
    middleware: list[Any], history: tuple[Message, ...], number: int, *, cold: bool = False
) -> float:
    """Seconds per step; ``cold``: each step on a fresh copy of ``history`` (made before)."""
    agent = Agent(model=instant_model, middleware=middleware)
    config = RunConfig(max_model_calls=None, max_tokens=200_000)
    repeat = 5
    copies = iter(
        [decode_messages(encode_messages(history)) for _ in range(number * repeat)] if cold else []
    )
    async with Session(agent, config=config, events=EventSink(logger=None)) as session:
        conversation = session.ctx.conversation

        async def step() -> None:
            conversation.replace(next(copies) if cold else history, emit_new=False)
            await session.run("what next?")

        return await abest_of(step, number=number, repeat=repeat)


# -- LangChain ---------------------------------------------------------------------------


def _langchain() -> Any:
    try:
        from langchain.agents import create_agent
        from langchain.agents import middleware as lc_middleware
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    except ImportError:
        return None
    return (
        create_agent,
        lc_middleware,
        GenericFakeChatModel,
        AIMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )


def _to_langchain(history: tuple[Message, ...], lc: Any) -> list[Any]:
    _, _, _, AIMessage, HumanMessage, SystemMessage, ToolMessage = lc
    out: list[Any] = []
    for message in history:
        if isinstance(message, ToolResult):
            out.append(ToolMessage(message.content, tool_call_id=message.tool_call_id))
        elif isinstance(message, AssistantMessage):
            calls = [
                {
                    "id": c.id,
                    "name": c.name,
                    "args": json.loads(json.dumps(dict(c.arguments), default=list)),
                }
                for c in message.tool_calls
            ]
            out.append(AIMessage(message.content, tool_calls=calls))
        elif message.role == "system":
            out.append(SystemMessage(message.text))
        else:
            out.append(HumanMessage(message.text))
    return out


def _lc_model(lc: Any) -> Any:
    _, _, GenericFakeChatModel, AIMessage, *_ = lc
    return GenericFakeChatModel(messages=itertools.cycle([AIMessage("ok")]))


class _LangChainNoop:
    """Built lazily so the module imports without LangChain."""

    @staticmethod
    def make(lc: Any) -> Any:
        base = lc[1].AgentMiddleware

        class Noop(base):  # type: ignore[misc, valid-type]
            async def awrap_model_call(self, request: Any, handler: Any) -> Any:
                return await handler(request)

        return Noop


async def _langchain_step(lc: Any, middleware: list[Any], history: list[Any], number: int) -> float:
    create_agent = lc[0]
    HumanMessage = lc[4]
    agent = create_agent(model=_lc_model(lc), tools=[], middleware=middleware)
    messages = [*history, HumanMessage("what next?")]

    async def step() -> None:
        await agent.ainvoke({"messages": list(messages)})

    return await abest_of(step, number=number)


def _langchain_full_stack(lc: Any) -> list[Any]:
    m = lc[1]
    return [
        m.ModelCallLimitMiddleware(run_limit=10_000),
        m.ToolCallLimitMiddleware(run_limit=10_000),
        m.ModelRetryMiddleware(max_retries=2),
        m.ContextEditingMiddleware(edits=[m.ClearToolUsesEdit(trigger=100_000)]),
        m.SummarizationMiddleware(model=_lc_model(lc), trigger=("tokens", 180_000)),
    ]


async def _measure(quick: bool) -> list[Row]:
    lc = _langchain()
    rows: list[Row] = []
    ours_n = 300 if quick else 2_000
    theirs_n = 20 if quick else 200
    empty: tuple[Message, ...] = (UserMessage("hi"),)

    # per-layer overhead inside a whole step
    base_ours = await _tinyctx_step([], empty, ours_n)
    base_theirs = None
    if lc is not None:
        lc_empty = _to_langchain(empty, lc)
        base_theirs = await _langchain_step(lc, [], lc_empty, theirs_n)
    for n in (0, 4, 8):
        ours = (
            await _tinyctx_step([Noop() if i == 0 else _named(i) for i in range(n)], empty, ours_n)
            if n
            else base_ours
        )
        theirs = None
        if lc is not None:
            noop = _LangChainNoop.make(lc)
            theirs = (
                await _langchain_step(
                    lc, [_lc_named(noop, i) for i in range(n)], lc_empty, theirs_n
                )
                if n
                else base_theirs
            )
        per_ours = (ours - base_ours) / n if n else None
        per_theirs = (
            (theirs - base_theirs) / n if n and theirs is not None and base_theirs else None
        )
        rows.append(
            Row(
                "agent step",
                f"{n} no-op layers, 1 model call",
                ours,
                baseline=None if theirs is None else f"LangChain {n} no-op middleware",
                baseline_seconds=theirs,
                extra={"per_layer_seconds": per_ours, "langchain_per_layer_seconds": per_theirs},
            )
        )

    # one step with the full stack on a real 100-message history
    history = history_100()
    ours = await _tinyctx_step(tinyctx_full_stack(), history, ours_n // 2)
    theirs = None
    if lc is not None:
        theirs = await _langchain_step(
            lc, _langchain_full_stack(lc), _to_langchain(history, lc), theirs_n
        )
    cold = await _tinyctx_step(tinyctx_full_stack(), history, max(10, ours_n // 20), cold=True)
    for label, seconds in (("warm memo", ours), ("cold, fresh copy", cold)):
        rows.append(
            Row(
                "agent step",
                f"full stack, {len(history)} real msgs, {label}",
                seconds,
                baseline=None if theirs is None else "LangChain create_agent + 5 middleware",
                baseline_seconds=theirs,
                target=None if theirs is None else "faster than LangChain",
                met=None if theirs is None else seconds < theirs,
            )
        )
    return rows


def _named(i: int) -> Noop:
    layer = Noop()
    layer.name = f"noop{i}"
    return layer


def _lc_named(cls: Any, i: int) -> Any:
    # LangChain middleware names must be unique too; a subclass per instance gives that
    return type(f"Noop{i}", (cls,), {})()


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="asyncio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        ours, theirs = (
            row.extra.get("per_layer_seconds"),
            row.extra.get("langchain_per_layer_seconds"),
        )
        if ours is not None:
            line = f"  {row.case}: tinyctx {ours * 1e6:.2f} µs per layer"
            if theirs is not None:
                line += f", LangChain {theirs * 1e6:.1f} µs per middleware"
            print(line)
