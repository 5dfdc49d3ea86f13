"""Hypothesis strategies for tinyctx values; histories always have valid pairing.

Every strategy is composable (pass one into another: ``requests(history=histories(...))``,
``contexts(history=...)``) and shrinks well: a history is drawn as a list of turns and the
tool-call ids are assigned *after* drawing, from positions, so hypothesis can delete any
turn, any call or any character and the history stays valid. A failing history shrinks
to the one or two turns that matter.

Importing this module imports hypothesis (the ``testing`` extra) and registers the
strategies for ``st.from_type`` on the public message, request and config types. With
tinyctx installed that also happens as soon as hypothesis is imported (a ``hypothesis``
entry point), so ``st.from_type(ToolResult)`` works without importing this module.

Strategies are built once and composites only draw from prebuilt ones: generating a long
history costs a few dozen choices, so thousands of examples stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._require import missing_hypothesis

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_hypothesis(__name__) from exc

from ..agent import Checkpoint
from ..context import RunConfig, RunContext
from ..control import Interrupt, StopWithFinal
from ..conversation import Conversation
from ..events import EventSink
from ..frozen import freeze
from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
    pending_tool_calls,
)
from ..model import ModelRequest, ModelResponse, Usage
from ..tools import ToolSpec
from ._message_strategies import (
    _HISTORIES,
    _IDS,
    _MAYBE_META,
    _MAYBE_TEXT,
    _META,
    _MODELS,
    _TAGS,
    _TEXT,
    _TOOL_CALLS,
    _call_id,
    contents,
    histories,
    json_values,
    media_parts,
    messages,
    texts,
    tool_arguments,
    tool_calls,
    tool_names,
    tool_results,
)

__all__ = [
    "texts",
    "tool_names",
    "json_values",
    "tool_arguments",
    "tool_calls",
    "tool_results",
    "messages",
    "histories",
    "media_parts",
    "contents",
    "tool_specs",
    "requests",
    "responses",
    "controls",
    "run_configs",
    "contexts",
    "usages",
    "layer_states",
    "checkpoints",
    "register_type_strategies",
]

T = TypeVar("T")
_SCHEMA_PROPERTIES = st.fixed_dictionaries(
    {},
    optional={
        "q": st.just({"type": "string"}),
        "limit": st.just({"type": "integer", "minimum": 0}),
        "path": st.just({"type": "string", "description": "a path"}),
    },
)


@st.composite
def tool_specs(draw: st.DrawFn) -> ToolSpec:
    """A tool spec with a small object schema."""
    props = draw(_SCHEMA_PROPERTIES)
    return ToolSpec(draw(tool_names), draw(texts(40)), {"type": "object", "properties": props})


def _spec_name(spec: ToolSpec) -> str:
    return spec.name


# requests draw their tools from a few ready specs: one draw per tool keeps them cheap
_REQUEST_TOOLS = st.lists(
    st.sampled_from(
        [
            ToolSpec("search", "Search the web", {"type": "object", "properties": {"q": {}}}),
            ToolSpec("read_file", "Read a file", {"type": "object", "properties": {"path": {}}}),
            ToolSpec("run", "Run a shell command"),
            ToolSpec("calc", "Évaluer une expression: 計算"),
        ]
    ),
    max_size=3,
    unique_by=_spec_name,
)


@st.composite
def requests(
    draw: st.DrawFn,
    history: st.SearchStrategy[Sequence[Message]] | None = None,
    *,
    tools: st.SearchStrategy[Sequence[ToolSpec]] | None = None,
) -> ModelRequest:
    """A model request: ``history`` (default ``histories()``), tools, system prompt, model.

    With the default history its messages never have a pending call, as the loop's
    requests never do.
    """
    msgs = draw(history if history is not None else _HISTORIES)
    return ModelRequest(
        messages=msgs,
        tools=tuple(draw(tools if tools is not None else _REQUEST_TOOLS)),
        system_prompt=draw(_MAYBE_TEXT),
        model=draw(_MODELS),
        metadata=draw(_MAYBE_META),
    )


_STOPS = st.builds(StopWithFinal, texts(40))
_INTERRUPTS = st.builds(Interrupt, st.text("abcdefgh_", min_size=1, max_size=8), texts(20))
_CONTROLS: st.SearchStrategy[StopWithFinal | Interrupt] = st.one_of(_STOPS, _INTERRUPTS)


def controls() -> st.SearchStrategy[StopWithFinal | Interrupt]:
    """A control outcome: StopWithFinal or Interrupt."""
    return _CONTROLS


_WINDOWS = st.none() | st.sampled_from([8_192, 128_000, 200_000, 1_000_000])


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    """Reported usage: cached tokens never exceed input tokens; sometimes a context window."""
    inp = draw(st.integers(0, 200_000))
    out = draw(st.integers(0, 8_000))
    return Usage(inp, out, draw(st.integers(0, inp)), context_window=draw(_WINDOWS))


_MAYBE_USAGE = st.none() | usages()


@st.composite
def responses(
    draw: st.DrawFn,
    *,
    text: st.SearchStrategy[str] | None = None,
    max_calls: int = 3,
    control: bool = False,
) -> ModelResponse:
    """A model response: text and/or up to ``max_calls`` tool calls (unique ids), usage.

    ``control=True`` sometimes attaches a control outcome, as a control layer would.
    """
    calls = draw(st.lists(_TOOL_CALLS, max_size=max_calls, unique_by=_call_id))
    return ModelResponse(
        AssistantMessage(draw(text if text is not None else _TEXT), tuple(calls)),
        usage=draw(_MAYBE_USAGE),
        control=draw(st.none() | _CONTROLS) if control else None,
        model=draw(_MODELS),
    )


# ---------------------------------------------------------------------------------------
# configs and contexts

_MAX_DEPTHS = st.integers(1, 20)
_MAYBE_LIMIT = st.none() | st.integers(1, 50)
_MAYBE_WINDOW = st.none() | st.integers(1_000, 1_000_000)
_MAYBE_ID = st.none() | _IDS


@st.composite
def run_configs(draw: st.DrawFn, *, nested: bool = False) -> RunConfig:
    """A valid RunConfig: ids, tags, metadata, limits and sometimes a context window.

    By default a root run; ``nested=True`` also draws runs at some depth below the root
    (with a consistent lineage), always with room for one more ``derive()``.
    """
    max_depth = draw(_MAX_DEPTHS)
    depth = draw(st.integers(0, max_depth - 1)) if nested else 0
    run_id = draw(_IDS)
    # ancestors never collide with run_id (hex only) nor with each other (indexed)
    lineage = tuple(f"run{i}-{draw(_IDS)}" for i in range(depth))
    max_tokens = draw(_MAYBE_WINDOW)
    reserved = draw(st.integers(0, max_tokens - 1)) if max_tokens is not None else 0
    return RunConfig(
        run_id=run_id,
        thread_id=draw(_IDS),
        parent_run_id=lineage[-1] if lineage else None,
        root_run_id=lineage[0] if lineage else run_id,
        lineage=lineage,
        tags=draw(_TAGS),
        metadata=draw(_META),
        configurable=draw(_META),
        depth=depth,
        max_depth=max_depth,
        max_model_calls=draw(_MAYBE_LIMIT),
        max_tool_calls=draw(_MAYBE_LIMIT),
        user_id=draw(_MAYBE_ID),
        model=draw(_MODELS),
        max_tokens=max_tokens,
        reserved_output_tokens=reserved,
    )


_ROOT_CONFIGS = run_configs()
_NESTED_CONFIGS = run_configs(nested=True)


@st.composite
def contexts(
    draw: st.DrawFn,
    data: st.SearchStrategy[Any] | None = None,
    *,
    history: st.SearchStrategy[Sequence[Message]] | None = None,
    nested: bool = False,
) -> RunContext[Any]:
    """A RunContext with fresh handles: a root run (``nested=True``: sometimes deeper).

    ``data`` draws the application data; ``history`` fills the conversation. Events reach
    subscribers and :func:`tinyctx.testing.capture_events` but are not logged.
    """
    config = draw(_NESTED_CONFIGS if nested else _ROOT_CONFIGS)
    conversation = Conversation(draw(history)) if history is not None else None
    return RunContext.new(
        config,
        draw(data) if data is not None else None,
        events=EventSink(logger=None),
        conversation=conversation,
    )


# ---------------------------------------------------------------------------------------
# st.from_type


def _for_every_parameter(strategy: st.SearchStrategy[T]) -> Callable[[type], st.SearchStrategy[T]]:
    # a generic class (RunContext[int]) resolves through a function of the requested type
    def resolve(_type: type) -> st.SearchStrategy[T]:
        return strategy

    return resolve


# ---------------------------------------------------------------------------------------
# durable values: layer state and checkpoints

_STATE_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_LAYER_NAMES = st.sampled_from(
    ["CallLimits", "BudgetGuard", "SessionMemory", "Summarize", "my_layer", "layer.with.dots"]
)
_LAYER_STATES: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    _LAYER_NAMES, _STATE_VALUES, max_size=3
)


def layer_states() -> st.SearchStrategy[dict[str, Any]]:
    """Layer state as a store keeps it: layer name to a JSON value (finite floats included)."""
    return _LAYER_STATES


_PENDING_HISTORIES = histories(max_turns=6, pending=True)


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    """The checkpoint of an interrupted run: its config, the history at the pause (the
    pending calls are the open calls of its last tool turn), what the run added, counters,
    usage, per-run layer state and the interrupt's payload."""
    history = draw(_PENDING_HISTORIES)
    pending = pending_tool_calls(history)
    added = history[draw(st.integers(0, len(history))) :]
    return Checkpoint(
        run_config=draw(_NESTED_CONFIGS),
        phase="tools" if pending else "before_model",
        pending=pending,
        node=draw(st.sampled_from(["approval", "tools", "HumanInTheLoop", ""])),
        message=draw(_TEXT),
        messages=history,
        added=added,
        model_calls=draw(st.integers(0, 50)),
        tool_calls=draw(st.integers(0, 50)),
        usage=draw(usages()),
        state=draw(_LAYER_STATES),
        payload=freeze(draw(st.none() | _STATE_VALUES)),
    )


def register_type_strategies() -> None:
    """Make ``st.from_type`` build valid tinyctx values (idempotent).

    Called when this module is imported, which the ``hypothesis`` entry point does as soon
    as hypothesis is imported. ``from_type(Message)`` draws any role; a lone ``ToolResult``
    pairs with nothing, so use :func:`histories` for sequences.
    """
    register = st.register_type_strategy
    register(ToolCall, _TOOL_CALLS)
    register(ToolResult, tool_results())
    register(SystemMessage, messages(roles=("system",)))
    register(UserMessage, messages(roles=("user",)))
    register(AssistantMessage, messages(roles=("assistant",)))
    register(Message, messages())
    register(ToolSpec, tool_specs())
    register(Usage, usages())
    register(ModelRequest, requests())
    register(ModelResponse, responses())
    register(StopWithFinal, _STOPS)
    register(Interrupt, _INTERRUPTS)
    register(RunConfig, _ROOT_CONFIGS)
    register(Checkpoint, checkpoints())
    register(Conversation, _HISTORIES.map(Conversation))
    register(RunContext, _for_every_parameter(contexts()))


register_type_strategies()
