"""tinyctx's stack inside each framework, beside the framework's own context management.

    python benchmarks/bench_integrations.py [--quick]

One real transcript (``../shared/data/transcripts/``, the framework's own fake model
replaying it as the start of a thread, then scripted tool turns with long results) and one
window, run through each framework's own agent loop:

- LangChain ``create_agent``: its ``SummarizationMiddleware`` + ``ContextEditingMiddleware``
  (summary at 90% of the window keeping 40% of it, tool uses cleared at 90% keeping 3),
  against ``TinyctxMiddleware(default_stack())``;
- pydantic-ai: its idiom for trimming (a history processor dropping the oldest requests
  until the history fits 90% of the window, cut where no tool call loses its result),
  against ``TinyctxCapability(default_stack())``;
- the OpenAI Agents SDK: the same trimming as a ``call_model_input_filter``, against
  ``TinyctxInputFilter(default_stack())`` with the tool wrapped by its ``wrap_tools`` (the
  stack's tool onion runs around every tool call, its cost counted in the per-call time).

Printed per framework and policy: prompt tokens sent over the run, its prompt-cache cost
(:mod:`tinyctx.cost`, Claude Sonnet 4.5 prices; every request counted by tinyctx's
heuristic counter), prefix breaks, the largest request (against the window), and the wall
time per model call the policy adds over the same loop with no context management. Target:
tinyctx's stack costs less per transcript than each framework's own at the same window, and
adds less per call than the framework's own middleware.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Row, print_table  # noqa: E402

from tinyctx import Message, ToolResult  # noqa: E402
from tinyctx.cost import DEFAULT_PRICE, PromptShape, price_calls, price_for  # noqa: E402
from tinyctx.messages import pending_tool_calls, safe_boundaries  # noqa: E402
from tinyctx.middleware.stacks import default_stack  # noqa: E402
from tinyctx.testing.transcripts import load_openai_jsonl  # noqa: E402
from tinyctx.tokens import default_counter  # noqa: E402

TRANSCRIPT = "transcripts/openai/marot__spotter__cc-main-4d5611e5.jsonl"
WINDOW = 32_000
RESULT = "result line of a long tool output\n" * 300
COUNTER = default_counter()


def _shared_data() -> Path | None:
    for candidate in (HERE.parent.parent / "shared" / "data", Path("/work/shared/data")):
        if (candidate / TRANSCRIPT).is_file():
            return candidate
    return None


def _start(path: Path) -> tuple[Message, ...]:
    """The transcript up to its last point with no call waiting for its result."""
    history = load_openai_jsonl(path)
    end = len(history)
    while end and pending_tool_calls(history[:end]):
        end -= 1
    return tuple(m for m in history[:end] if not isinstance(m, ToolResult) or m.tool_call_id)


def _price(requests: Sequence[Sequence[Message]]) -> dict[str, Any]:
    shapes = [
        PromptShape(tuple(r), tuple(COUNTER.count_message(m) for m in r), 0, 20) for r in requests
    ]
    report = price_calls(shapes, price_for(DEFAULT_PRICE))
    return {
        "cost": report.total,
        "prompt_tokens": report.prompt_tokens,
        "breaks": report.breaks,
        "largest": max((s.prompt_tokens for s in shapes), default=0),
    }


def _fits_tail(messages: Sequence[Message], limit: int) -> int:
    """Where to cut so the newest messages fit ``limit`` tokens, where no call loses its
    result: the trimming the frameworks document (drop the oldest), done carefully."""
    safe = safe_boundaries(messages)
    total = 0
    cut = len(messages)
    for index in range(len(messages) - 1, -1, -1):
        total += COUNTER.count_message(messages[index])
        if total > limit:
            break
        if safe[index]:
            cut = index
    return cut


# -- LangChain ------------------------------------------------------------------------------


async def _langchain(
    start: tuple[Message, ...], steps: int, policy: str
) -> tuple[list[Any], float]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        AgentMiddleware,
        ClearToolUsesEdit,
        ContextEditingMiddleware,
        SummarizationMiddleware,
    )
    from langchain_core.language_models.fake_chat_models import (
        FakeListChatModel,
        GenericFakeChatModel,
    )
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from tinyctx.integrations.langchain import TinyctxMiddleware
    from tinyctx.integrations.langchain_messages import (
        from_langchain,
        from_langchain_message,
        to_langchain,
    )

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    class Recorder(AgentMiddleware):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__()
            self.sent: list[list[Any]] = []

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            self.sent.append(list(request.messages))
            return await handler(request)

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return RESULT

    def count(messages: Sequence[Any]) -> int:
        return sum(COUNTER.count_message(from_langchain_message(m)) for m in messages)

    middleware: list[Any] = []
    if policy == "own":
        middleware = [
            SummarizationMiddleware(
                FakeListChatModel(responses=["Summary of the earlier conversation."] * 1000),
                trigger=("tokens", int(0.9 * WINDOW)),
                keep=("tokens", int(0.4 * WINDOW)),
                token_counter=count,
            ),
            ContextEditingMiddleware(
                edits=[ClearToolUsesEdit(trigger=int(0.9 * WINDOW), keep=3)], token_counter=count
            ),
        ]
    elif policy == "tinyctx":
        middleware = [TinyctxMiddleware(default_stack(), max_tokens=WINDOW)]
    recorder = Recorder()
    script = [
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"query": str(i)}, "id": f"b{i}"}])
        for i in range(steps)
    ]
    agent = create_agent(
        Fake(messages=iter([*script, AIMessage("done")])),
        tools=[lookup],
        middleware=[*middleware, recorder],
    )
    began = time.perf_counter()
    await agent.ainvoke({"messages": [*to_langchain(start), HumanMessage("go on")]})
    elapsed = time.perf_counter() - began
    return [from_langchain(s) for s in recorder.sent], elapsed


# -- pydantic-ai ----------------------------------------------------------------------------


async def _pydantic_ai(
    start: tuple[Message, ...], steps: int, policy: str
) -> tuple[list[Any], float]:
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessHistory
    from pydantic_ai.messages import ModelResponse, RequestUsage, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from tinyctx.integrations.pydantic_ai import TinyctxCapability
    from tinyctx.integrations.pydantic_ai_messages import from_pydantic_ai, to_pydantic_ai

    sent: list[Any] = []

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        sent.append(messages)
        # report the prompt as the one counter of this benchmark counts it (FunctionModel's
        # own estimate counts words, which would calibrate the guard to another counter)
        prompt = COUNTER.count_messages(from_pydantic_ai(messages))
        usage = RequestUsage(input_tokens=prompt, output_tokens=20)
        if len(sent) <= steps:
            call = ToolCallPart("lookup", {"query": str(len(sent))}, tool_call_id=f"p{len(sent)}")
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    def trim(messages: list[Any]) -> list[Any]:
        history = from_pydantic_ai(messages)
        return to_pydantic_ai(history[_fits_tail(history, int(0.9 * WINDOW)) :])

    capabilities: list[Any] = []
    if policy == "own":
        capabilities = [ProcessHistory(trim)]
    elif policy == "tinyctx":
        capabilities = [TinyctxCapability(default_stack(), max_tokens=WINDOW)]
    agent: Agent[None, str] = Agent(FunctionModel(respond), capabilities=capabilities)

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look something up."""
        return RESULT

    began = time.perf_counter()
    await agent.run("go on", message_history=to_pydantic_ai(start))
    elapsed = time.perf_counter() - began
    return [from_pydantic_ai(s) for s in sent], elapsed


# -- the OpenAI Agents SDK ------------------------------------------------------------------


async def _agents(start: tuple[Message, ...], steps: int, policy: str) -> tuple[list[Any], float]:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.run_config import ModelInputData
    from agents.testing import ScriptedModel, assistant_message, function_call

    from tinyctx.integrations.openai_agents import TinyctxInputFilter
    from tinyctx.integrations.openai_agents_items import from_agents_items, to_agents_items

    @function_tool
    def lookup(query: str) -> str:
        """Look something up."""
        return RESULT

    def trim(data: Any) -> ModelInputData:
        history = from_agents_items(data.model_data.input)
        kept = history[_fits_tail(history, int(0.9 * WINDOW)) :]
        return ModelInputData(
            input=to_agents_items(kept), instructions=data.model_data.instructions
        )

    filters: dict[str, Any] = {
        "none": None,
        "own": trim,
        "tinyctx": TinyctxInputFilter(default_stack(), max_tokens=WINDOW),
    }
    tools: list[Any] = [lookup]
    if policy == "tinyctx":  # the whole integration: the tool layers run around the tool too
        tools = filters["tinyctx"].wrap_tools(tools)
    model = ScriptedModel(
        [
            *([function_call("lookup", {"query": str(i)}, call_id=f"a{i}")] for i in range(steps)),
            [assistant_message("done")],
        ]
    )
    config = RunConfig(call_model_input_filter=filters[policy], tracing_disabled=True)
    agent = Agent(name="bench", model=model, tools=tools)
    items = [*to_agents_items(start), {"role": "user", "content": "go on"}]
    began = time.perf_counter()
    await Runner.run(agent, items, run_config=config, max_turns=steps + 5)
    elapsed = time.perf_counter() - began
    return [from_agents_items(call.input) for call in model.calls], elapsed


Runner_ = Callable[[tuple[Message, ...], int, str], Awaitable[tuple[list[Any], float]]]
FRAMEWORKS: dict[str, Runner_] = {
    "langchain": _langchain,
    "pydantic-ai": _pydantic_ai,
    "openai-agents": _agents,
}


async def _measure(quick: bool) -> list[Row]:
    data = _shared_data()
    if data is None:
        print("shared transcripts not found: nothing measured")
        return []
    start = _start(data / TRANSCRIPT)
    steps = 6 if quick else 20
    rounds = 2 if quick else 3
    rows: list[Row] = []
    for name, run in FRAMEWORKS.items():
        results: dict[str, dict[str, Any]] = {}
        for policy in ("none", "own", "tinyctx"):  # warm up: imports, first-use set-up
            await run(start, 1, policy)
        for policy in ("none", "own", "tinyctx"):
            best = float("inf")
            for _ in range(rounds):
                sent, elapsed = await run(start, steps, policy)
                best = min(best, elapsed)
            results[policy] = {**_price(sent), "per_call": best / max(1, len(sent))}
        base = results["none"]["per_call"]
        own, ours = results["own"], results["tinyctx"]
        for policy in ("own", "tinyctx"):
            r = results[policy]
            added = r["per_call"] - base
            rows.append(
                Row(
                    f"integrations/{name}",
                    f"{policy} policy, per model call",
                    r["per_call"],
                    baseline="no context management",
                    baseline_seconds=base,
                    target="cheaper and lighter than own" if policy == "tinyctx" else None,
                    met=(
                        ours["cost"] < own["cost"]
                        and ours["per_call"] - base < own["per_call"] - base
                    )
                    if policy == "tinyctx"
                    else None,
                    extra={**r, "added_per_call": added},
                )
            )
    return rows


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(_measure(quick))


if __name__ == "__main__":
    table = run(quick="--quick" in sys.argv)
    print_table(table)
    print()
    print(f"window {WINDOW} tokens; cost at {DEFAULT_PRICE} prices")
    header = (
        f"{'framework / policy':<34} {'cost $':>9} {'prompt tok':>11} {'breaks':>7} "
        f"{'largest':>8} {'added/call':>11}"
    )
    print(header)
    for row in table:
        e = row.extra
        label = f"{row.group.split('/')[1]} / {row.case.split()[0]}"
        print(
            f"{label:<34} {e['cost']:>9.4f} {e['prompt_tokens']:>11} {e['breaks']:>7} "
            f"{e['largest']:>8} {e['added_per_call'] * 1e3:>9.2f}ms"
        )
