"""Strategies for messages, tool calls and histories (well-formed tool turns by construction)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import frozen

from ._require import missing_hypothesis

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_hypothesis(__name__) from exc


from ..config import fraction, integer
from ..errors import ConfigError
from ..messages import (
    AssistantMessage,
    Message,
    Role,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..parts import Content, DocumentPart, ImagePart, Part, TextPart
from .images import image_part, pdf_part

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

    Args:
        min_turns: The fewest turns.
        max_turns: The most turns.
        tool_turn_probability: The chance that a turn is a tool turn.
        max_results_per_turn: The most tool calls of a tool turn.
        with_system: Start with a system message.
        nonessential: Sometimes mark a user message non-essential.
        text: The strategy of every message body; default :func:`texts`.
        pending: Let the last tool turn miss some results.
        media: The chance that a user message or tool result holds media parts.
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
