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

from attrs import frozen

from ._require import missing_hypothesis

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_hypothesis(__name__) from exc

from ..agent import Checkpoint
from ..config import fraction, integer
from ..context import RunConfig, RunContext
from ..control import Interrupt, StopWithFinal
from ..conversation import Conversation
from ..errors import ConfigError
from ..events import EventSink
from ..frozen import freeze
from ..messages import (
    AssistantMessage,
    Message,
    Role,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
    pending_tool_calls,
)
from ..model import ModelRequest, ModelResponse, Usage
from ..parts import Content, DocumentPart, ImagePart, Part, TextPart
from ..tools import ToolSpec
from .images import image_part, pdf_part

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
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


def texts(max_size: int = 80) -> st.SearchStrategy[str]:
    """Any unicode text (multi-byte, CJK, emoji included), shrinking toward ""."""
    return st.text(max_size=max_size)


tool_names: st.SearchStrategy[str] = st.sampled_from(
    ["search", "read_file", "run", "calc", "fetch", "write"]
)
"""Tool names, shrinking toward "search"."""

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
"""JSON-compatible values (no floats: they do not round-trip through every provider)."""

_TEXT = texts()
_BOOL = st.booleans()
_MAYBE_TEXT = st.none() | texts(60)
_ARGUMENTS = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=3)
_CALL_IDS = st.text("abcdef0123456789", min_size=4, max_size=8).map("call_".__add__)
_SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=12)
_META = st.dictionaries(
    st.sampled_from(["user", "team", "trace", "tier", "locale", "source"]),
    _SCALARS | st.lists(_SCALARS, max_size=2),
    max_size=3,
)
_MAYBE_META = st.none() | _META
_MODELS = st.sampled_from([None, "gpt-4o", "claude-sonnet-4-5", "gpt-4o-mini"])
_IDS = st.text("0123456789abcdef", min_size=8, max_size=12)
_TAGS = st.lists(st.text("abcdefghij-", min_size=1, max_size=8), max_size=4)
# tool calls inside histories: one draw per call (name, arguments, whether it fails) keeps
# long histories cheap to generate and to shrink; tool_calls() draws arbitrary JSON
# arguments when the arguments themselves are under test
_HISTORY_CALLS: st.SearchStrategy[tuple[str, dict[str, Any], bool]] = st.sampled_from(
    [
        ("search", {}, False),
        ("search", {"q": "tinyctx"}, False),
        ("read_file", {"path": "README.md", "limit": 20}, False),
        ("search", {"q": "日本語のドキュメント", "lang": "ja"}, False),
        ("run", {"cmd": "ls -la", "timeout": None, "env": {"CI": True}}, True),
        ("write", {"items": [1, 2, 3], "payload": "x" * 400}, False),
        ("fetch", {"url": "https://example.com/a?b=c"}, True),
        ("calc", {"expr": "2 + 2"}, False),
    ]
)


# small valid images and documents, built once: their headers say real screen sizes (what
# token counting reads), their bytes stay small
_MEDIA: tuple[ImagePart | DocumentPart, ...] = (
    image_part(1280, 800, "image/jpeg", label="screenshot"),
    image_part(2560, 1600, "image/webp", label="screenshot"),
    image_part(64, 48, "image/png"),
    image_part(300, 200, "image/gif", label="chart"),
    image_part(8, 8, "image/png"),
    ImagePart(url="https://example.com/photo.jpg", detail="low"),
    pdf_part(1, title="report.pdf"),
    DocumentPart.from_text("Quarterly notes: revenue up 4 %.", title="notes.txt"),
)
_MEDIA_PART: st.SearchStrategy[ImagePart | DocumentPart] = st.sampled_from(_MEDIA)


def media_parts() -> st.SearchStrategy[ImagePart | DocumentPart]:
    """One image or document part (screenshots of real sizes, a tiny image, a URL image,
    a PDF, a text file), shrinking toward a 1280×800 JPEG screenshot."""
    return _MEDIA_PART


def _parts_content(text: str, media: list[ImagePart | DocumentPart], first: bool) -> Content:
    parts: list[Part] = list(media)
    if text:
        if first:
            parts.insert(0, TextPart(text))
        else:
            parts.append(TextPart(text))
    return tuple(parts)


_MEDIA_LISTS = st.lists(_MEDIA_PART, min_size=1, max_size=2)
_MEDIA_ROLL = st.integers(0, 9)


def contents(
    text: st.SearchStrategy[str] | None = None, *, media: float = 0.3
) -> st.SearchStrategy[Content]:
    """A message content: text, or (with probability ``media``) content parts holding 1-2
    images or documents and the text, if any. Shrinks toward plain text."""
    body = text if text is not None else _TEXT
    if not media:
        return body
    threshold = 10 - round(10 * media)

    @st.composite
    def draw_content(draw: st.DrawFn) -> Content:
        value = draw(body)
        if draw(_MEDIA_ROLL) < threshold:
            return value
        return _parts_content(value, draw(_MEDIA_LISTS), draw(_BOOL))

    return draw_content()


def tool_arguments() -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object of tool arguments, shrinking toward ``{}``."""
    return _ARGUMENTS


@st.composite
def tool_calls(draw: st.DrawFn, id: str | None = None) -> ToolCall:
    """One tool call; ``id`` fixes its id (otherwise ``call_<hex>``)."""
    return ToolCall(id or draw(_CALL_IDS), draw(tool_names), draw(_ARGUMENTS))


_TOOL_CALLS = tool_calls()


@st.composite
def tool_results(
    draw: st.DrawFn,
    call: ToolCall | None = None,
    *,
    text: st.SearchStrategy[str] | None = None,
    metadata: st.SearchStrategy[dict[str, Any] | None] | None = None,
) -> ToolResult:
    """A tool result answering ``call`` (or a generated call: it then pairs with nothing)."""
    answered = call if call is not None else draw(_TOOL_CALLS)
    content = draw(text if text is not None else _TEXT)
    meta = draw(metadata) if metadata is not None else None
    return ToolResult(answered.id, content, answered.name, draw(_BOOL), metadata=meta)


def _call_id(call: ToolCall) -> str:
    return call.id


_CALL_LISTS = st.lists(_TOOL_CALLS, max_size=2, unique_by=_call_id)


def messages(
    text: st.SearchStrategy[str] | None = None,
    *,
    roles: Sequence[Role] = ROLES,
    metadata: bool = True,
) -> st.SearchStrategy[Message]:
    """One message of one of ``roles`` (a tool result here pairs with nothing: use histories()).

    System and user messages are sometimes non-essential; with ``metadata`` a message
    sometimes carries read-only metadata a layer must keep. Shrinks toward a system message.
    """
    chosen = tuple(roles)
    if not chosen or any(r not in ROLES for r in chosen):
        raise ConfigError("roles", roles, f"a non-empty subset of {ROLES}", owner="messages")
    body = text if text is not None else _TEXT
    meta = _MAYBE_META if metadata else st.none()

    def essential(cls: type[SystemMessage] | type[UserMessage]) -> st.SearchStrategy[Message]:
        return st.builds(_essential_message, st.just(cls), body, _BOOL, meta)

    by_role: dict[Role, st.SearchStrategy[Message]] = {
        "system": essential(SystemMessage),
        "user": essential(UserMessage),
        "assistant": st.builds(_assistant, body, _CALL_LISTS, meta),
        "tool": tool_results(text=body, metadata=meta),
    }
    return st.one_of([by_role[r] for r in chosen])


def _essential_message(
    cls: type[SystemMessage] | type[UserMessage],
    content: str,
    droppable: bool,
    metadata: dict[str, Any] | None,
) -> Message:
    return cls(content, essential=not droppable, metadata=metadata)


def _assistant(
    content: str, calls: list[ToolCall], metadata: dict[str, Any] | None
) -> AssistantMessage:
    return AssistantMessage(content, tuple(calls), metadata=metadata)


# ---------------------------------------------------------------------------------------
# histories: drawn as turn drafts, ids assigned afterwards so every shrink stays valid


@frozen
class _ToolTurnDraft:
    text: str
    calls: tuple[tuple[str, dict[str, Any], bool], ...]
    results: tuple[Content, ...]
    order: tuple[int, ...]
    answered: tuple[bool, ...] | None  # None: every call answered (not the pending tail)

    def build(self, index: int) -> list[Message]:
        calls = tuple(
            ToolCall(f"call_{index}_{k}", name, arguments)
            for k, (name, arguments, _) in enumerate(self.calls)
        )
        answered = self.answered or (True,) * len(calls)
        results = [
            ToolResult(calls[k].id, self.results[k], calls[k].name, self.calls[k][2])
            for k in self.order
            if answered[k]
        ]
        return [AssistantMessage(self.text, calls), *results]


def _tool_turn_drawer(
    max_results: int, body: st.SearchStrategy[str], content: st.SearchStrategy[Content]
) -> Callable[[st.DrawFn, bool], _ToolTurnDraft]:
    counts = st.integers(1, max_results)
    permutations = {n: st.permutations(range(n)) for n in range(2, max_results + 1)}
    answered = {n: st.lists(_BOOL, min_size=n, max_size=n) for n in range(1, max_results + 1)}

    def draw_turn(draw: st.DrawFn, pending: bool) -> _ToolTurnDraft:
        count = draw(counts)
        calls = tuple(draw(_HISTORY_CALLS) for _ in range(count))
        results = tuple(draw(content) for _ in range(count))
        order = tuple(draw(permutations[count])) if count > 1 else (0,)
        marks = tuple(draw(answered[count])) if pending else None
        return _ToolTurnDraft(draw(body), calls, results, order, marks)

    return draw_turn


def _assemble(
    system: Message | None, turns: Sequence[Message | _ToolTurnDraft]
) -> tuple[Message, ...]:
    out: list[Message] = [] if system is None else [system]
    for index, turn in enumerate(turns):
        if isinstance(turn, _ToolTurnDraft):
            out.extend(turn.build(index))
        else:
            out.append(turn)
    return tuple(out)


def _append_turn(
    head: list[Message | _ToolTurnDraft], tail: _ToolTurnDraft
) -> list[Message | _ToolTurnDraft]:
    return [*head, tail]


_SHARE = fraction(zero=True)


def _check_int(value: object, minimum: int, field: str, allowed: str) -> None:
    integer(minimum=minimum, allowed=allowed).check(value, field, "histories")


def histories(
    min_turns: int = 0,
    max_turns: int = 12,
    tool_turn_probability: float = 0.5,
    max_results_per_turn: int = 3,
    with_system: bool = True,
    nonessential: bool = True,
    text: st.SearchStrategy[str] | None = None,
    *,
    pending: bool = False,
    media: float = 0.3,
) -> st.SearchStrategy[tuple[Message, ...]]:
    """Conversations whose every tool call is answered: ``check_pairing`` always passes.

    A history is an optional system message (``with_system``) and ``min_turns`` to
    ``max_turns`` turns. A turn is a user message (sometimes non-essential when
    ``nonessential``), a plain assistant answer, or - with ``tool_turn_probability`` - a
    tool turn: an assistant message with 1..``max_results_per_turn`` calls followed by their
    results (sometimes in another order, some of them errors). ``text`` draws every body.

    With ``pending=True`` the last tool turn may miss some results (the state of a run while
    its tools execute): ``check_pairing(h)`` passes, ``allow_pending=False`` may not.

    ``media`` is the probability that a user message or a tool result holds content parts
    with images or documents (:func:`contents`; 0 for text only). Bad arguments raise
    :class:`tinyctx.ConfigError` at once.
    """
    _check_int(min_turns, 0, "min_turns", "an integer >= 0")
    _check_int(max_turns, min_turns, "max_turns", f"an integer >= min_turns ({min_turns})")
    _check_int(max_results_per_turn, 1, "max_results_per_turn", "an integer >= 1")
    _SHARE.check(tool_turn_probability, "tool_turn_probability", "histories")
    _SHARE.check(media, "media", "histories")
    body = text if text is not None else _TEXT
    content = contents(body, media=media)
    draw_tool_turn = _tool_turn_drawer(max_results_per_turn, body, content)
    # one integer decides the kind of a turn and shrinks toward 0: a user message, then an
    # answer, then (unless every turn must be one) a tool turn
    kinds = st.integers(0, 999)
    tool_from = round(1000 * (1 - tool_turn_probability))
    answer_from = tool_from * 3 // 5
    droppable = _BOOL if nonessential else st.just(False)

    @st.composite
    def one_turn(draw: st.DrawFn) -> Message | _ToolTurnDraft:
        kind = draw(kinds)
        if kind >= tool_from:
            return draw_tool_turn(draw, False)
        if kind >= answer_from:
            return AssistantMessage(draw(body))
        return UserMessage(draw(content), essential=not draw(droppable))

    @st.composite
    def pending_turn(draw: st.DrawFn) -> _ToolTurnDraft:
        return draw_tool_turn(draw, True)

    turn = one_turn()
    turns: st.SearchStrategy[list[Message | _ToolTurnDraft]] = st.lists(
        turn, min_size=min_turns, max_size=max_turns
    )
    if pending and tool_turn_probability > 0 and max_turns > 0:
        # the same turn budget, the last turn a tool turn whose results may be missing
        head = st.lists(turn, min_size=max(min_turns - 1, 0), max_size=max_turns - 1)
        turns = turns | st.builds(_append_turn, head, pending_turn())
    system = (st.none() | st.builds(SystemMessage, body)) if with_system else st.none()
    return st.builds(_assemble, system, turns)


_HISTORIES = histories()


# ---------------------------------------------------------------------------------------
# requests, responses, controls, usage


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
