"""Hypothesis strategies for tinyctx values; histories always have valid pairing.

Ids are derived from positions, so every generated history has unique tool-call ids and a
failing example shrinks to a few messages (fewer turns, fewer calls, shorter text).
Importing this module imports hypothesis (the ``testing`` extra).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..context import RunConfig, RunContext
from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..model import ModelRequest, Usage
from ..tools import ToolSpec

__all__ = [
    "texts",
    "tool_names",
    "json_values",
    "tool_arguments",
    "tool_calls",
    "messages",
    "histories",
    "tool_specs",
    "requests",
    "run_configs",
    "contexts",
    "usages",
    "register_type_strategies",
]


def texts(max_size: int = 80) -> st.SearchStrategy[str]:
    """Any unicode text (multi-byte, CJK, emoji included), shrinking toward ""."""
    return st.text(max_size=max_size)


tool_names = st.sampled_from(["search", "read_file", "run", "calc", "fetch", "write"])

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def tool_arguments() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=3)


@st.composite
def tool_calls(draw: st.DrawFn, id: str | None = None) -> ToolCall:
    call_id = id or draw(
        st.text("abcdef0123456789", min_size=4, max_size=8).map(lambda s: f"call_{s}")
    )
    return ToolCall(call_id, draw(tool_names), draw(tool_arguments()))


@st.composite
def messages(draw: st.DrawFn, text: st.SearchStrategy[str] | None = None) -> Message:
    """One message of any role (a tool result here pairs with nothing: use histories())."""
    body = text if text is not None else texts()
    kind = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    essential = draw(st.booleans()) if kind in ("system", "user") else True
    if kind == "system":
        return SystemMessage(draw(body), essential=essential)
    if kind == "user":
        return UserMessage(draw(body), essential=essential)
    if kind == "assistant":
        calls = draw(st.lists(tool_calls(), max_size=2, unique_by=lambda c: c.id))
        return AssistantMessage(draw(body), tuple(calls))
    call = draw(tool_calls())
    return ToolResult(call.id, draw(body), call.name, draw(st.booleans()))


@st.composite
def _turn(
    draw: st.DrawFn,
    index: int,
    tool_turn_probability: float,
    max_results_per_turn: int,
    nonessential: bool,
    body: st.SearchStrategy[str],
) -> list[Message]:
    if draw(st.integers(0, 99)) < tool_turn_probability * 100:
        kind = "tool"
    else:
        kind = draw(st.sampled_from(["user", "answer"]))
    if kind == "user":
        essential = not (nonessential and draw(st.booleans()))
        return [UserMessage(draw(body), essential=essential)]
    if kind == "answer":
        return [AssistantMessage(draw(body))]
    count = draw(st.integers(1, max_results_per_turn))
    calls = tuple(
        ToolCall(f"call_{index}_{k}", draw(tool_names), draw(tool_arguments()))
        for k in range(count)
    )
    results = [ToolResult(c.id, draw(body), c.name, draw(st.booleans())) for c in calls]
    if count > 1 and draw(st.booleans()):
        results = draw(st.permutations(results))
    return [AssistantMessage(draw(body), calls), *results]


@st.composite
def histories(
    draw: st.DrawFn,
    min_turns: int = 0,
    max_turns: int = 12,
    tool_turn_probability: float = 0.5,
    max_results_per_turn: int = 3,
    with_system: bool = True,
    nonessential: bool = True,
    text: st.SearchStrategy[str] | None = None,
) -> tuple[Message, ...]:
    """A conversation whose every tool call is answered (no pending calls at the end).

    Turns are user messages (some non-essential when ``nonessential``), plain assistant
    answers, or tool turns: an assistant message with 1..``max_results_per_turn`` calls
    followed by their results (sometimes in another order).
    """
    if not 0 <= tool_turn_probability <= 1:
        raise ValueError("tool_turn_probability must be within [0, 1]")
    if max_results_per_turn < 1:
        raise ValueError("max_results_per_turn must be >= 1")
    body = text if text is not None else texts()
    out: list[Message] = []
    if with_system and draw(st.booleans()):
        out.append(SystemMessage(draw(body)))
    turns = draw(st.integers(min_turns, max_turns))
    for index in range(turns):
        out.extend(
            draw(_turn(index, tool_turn_probability, max_results_per_turn, nonessential, body))
        )
    return tuple(out)


@st.composite
def tool_specs(draw: st.DrawFn) -> ToolSpec:
    name = draw(tool_names)
    props = draw(
        st.dictionaries(
            st.text("abcdefgh", min_size=1, max_size=6),
            st.sampled_from([{"type": "string"}, {"type": "integer"}]),
            max_size=3,
        )
    )
    return ToolSpec(name, draw(texts(40)), {"type": "object", "properties": props})


@st.composite
def requests(
    draw: st.DrawFn, history: st.SearchStrategy[tuple[Message, ...]] | None = None
) -> ModelRequest:
    msgs = draw(history if history is not None else histories())
    specs = draw(st.lists(tool_specs(), max_size=3, unique_by=lambda s: s.name))
    return ModelRequest(
        messages=msgs,
        tools=tuple(specs),
        system_prompt=draw(st.none() | texts(60)),
        model=draw(st.sampled_from([None, "gpt-4o", "claude-sonnet-4-5"])),
    )


_ids = st.text("0123456789abcdef", min_size=8, max_size=12)
_tags = st.lists(st.text("abcdefghij-", min_size=1, max_size=8), max_size=4)
_meta = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6), json_values, max_size=3)


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    return RunConfig(
        run_id=draw(_ids),
        thread_id=draw(_ids),
        tags=draw(_tags),
        metadata=draw(_meta),
        configurable=draw(_meta),
        max_depth=draw(st.integers(1, 20)),
        max_model_calls=draw(st.none() | st.integers(1, 50)),
        user_id=draw(st.none() | _ids),
    )


@st.composite
def contexts(draw: st.DrawFn, data: st.SearchStrategy[Any] | None = None) -> RunContext[Any]:
    return RunContext.new(draw(run_configs()), draw(data) if data is not None else None)


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    inp = draw(st.integers(0, 200_000))
    return Usage(inp, draw(st.integers(0, 8_000)), draw(st.integers(0, inp)))


def register_type_strategies() -> None:
    """Make ``st.from_type`` build valid tinyctx values (called on import of this module)."""
    st.register_type_strategy(ToolCall, tool_calls())
    st.register_type_strategy(Usage, usages())
    st.register_type_strategy(RunConfig, run_configs())
    st.register_type_strategy(ModelRequest, requests())
    st.register_type_strategy(SystemMessage, texts().map(SystemMessage))
    st.register_type_strategy(UserMessage, texts().map(UserMessage))
    st.register_type_strategy(AssistantMessage, texts().map(AssistantMessage))
    st.register_type_strategy(Message, messages())


register_type_strategies()
