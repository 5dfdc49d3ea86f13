"""Message types and the tool call/result pairing rules every layer must keep.

Messages are frozen, hashable (the hash is cached) and cheap to compare. A tool call and
its result are one unit: :func:`check_pairing` names the first orphan, and
:func:`safe_boundaries` tells a compaction layer where it may cut a history without
separating a call from its result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self

import attrs
from attrs import field, frozen
from attrs.validators import instance_of

from .errors import PairingError, a_type
from .frozen import (
    EMPTY,
    HUGE_INT,
    MAX_NESTING,
    SPLIT_PAIR,
    FrozenDict,
    NestingError,
    frozen_mapping,
    text_fits,
    value_fits,
)
from .parts import (
    Content,
    Part,
    TextPart,
    content_parts,
    content_text,
    describe_content,
    to_content,
)

__all__ = [
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolCall",
    "ToolResult",
    "Role",
    "check_pairing",
    "pending_tool_calls",
    "safe_boundaries",
    "snap_boundary",
    "tool_turns",
    "ToolTurn",
    "answer_pending",
    "RENAMED_IDS",
    "call_ids",
    "fresh_call_ids",
    "with_renamed_ids",
    "valid_text",
    "valid_message",
]

Role = Literal["system", "user", "assistant", "tool"]


def _tuple_of_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    calls = value if type(value) is tuple else tuple(value)
    for call in calls:
        if not isinstance(call, ToolCall):
            raise TypeError(f"tool_calls must contain ToolCall objects, got {type(call).__name__}")
    if len(calls) > 1 and len({c.id for c in calls}) != len(calls):
        ids = [c.id for c in calls]
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"tool_calls: duplicate tool call id {dup!r} in one assistant message")
    return calls


def _nonempty_str(instance: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why a (frozen) value is not JSON, or None when it is (``depth``: the levels of
    objects and arrays around it)."""
    t = type(value)
    if t is str:
        return None if text_fits(value) else f"the string {value!r} {SPLIT_PAIR}"
    if t is bool or value is None:
        return None
    if t is int:
        return None if value_fits(value) else f"the value {HUGE_INT}"
    if t is float:
        return None if math.isfinite(value) else f"the float {value!r} is not finite"
    if isinstance(value, (tuple, Mapping)) and depth >= MAX_NESTING:
        return f"it nests deeper than {MAX_NESTING} levels (tinyctx.codec.MAX_NESTING)"
    if isinstance(value, tuple):
        for item in value:
            problem = _json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"the object key {key!r} is {a_type(type(key))}, not a str"
            if not text_fits(key):
                return f"the object key {key!r} {SPLIT_PAIR}"
            problem = _json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, (int, float)):  # int and float subclasses (enums...) stay numbers
        return None
    return f"{a_type(t)} is not a JSON value"


def _json_arguments(instance: ToolCall, attribute: Any, value: FrozenDict[str, Any]) -> None:
    for name, argument in value.items():
        problem = _json_problem(argument, 1)
        if problem is not None:
            raise TypeError(
                f"ToolCall {instance.id!r} ({instance.name}): argument {name!r} is not JSON: "
                f"{problem}; arguments must be JSON values (str, int, float, bool, None, "
                "lists and objects with str keys)"
            )


def _frozen_arguments(value: Mapping[str, Any] | None) -> FrozenDict[str, Any]:
    """:func:`frozen_mapping`; nested past MAX_NESTING: a NestingError naming the field."""
    try:
        return frozen_mapping(value)
    except NestingError as exc:
        raise NestingError(f"ToolCall.arguments: {exc}") from None
    except TypeError as exc:  # not a mapping
        raise TypeError(f"ToolCall.arguments: {exc}") from None


def _frozen_metadata(value: Mapping[str, Any] | None) -> FrozenDict[str, Any]:
    """:func:`frozen_mapping`; nested past MAX_NESTING: a NestingError naming the field."""
    if type(value) is FrozenDict:
        return value  # frozen already (the default EMPTY too): what frozen_mapping returns
    try:
        return frozen_mapping(value)
    except NestingError as exc:
        raise NestingError(f"Message.metadata: {exc}") from None
    except TypeError as exc:  # not a mapping
        raise TypeError(f"Message.metadata: {exc}") from None


@frozen(cache_hash=True)
class ToolCall:
    """One function call the model asked for. ``arguments`` is deep-frozen JSON, checked
    when the call is built (a non-JSON value is a TypeError naming the call and argument)."""

    id: str = field(validator=_nonempty_str)
    name: str = field(validator=_nonempty_str)
    arguments: FrozenDict[str, Any] = field(
        default=EMPTY, converter=_frozen_arguments, validator=_json_arguments
    )
    invalid_arguments: str | None = field(default=None, kw_only=True)
    """Raw argument text the model produced that was not a JSON object, if any."""


@frozen(cache_hash=True)
class Message:
    """Base of every message. ``essential=False`` marks droppable retrieved context."""

    role: ClassVar[Role]
    essential: bool = field(default=True, kw_only=True, validator=instance_of(bool))
    metadata: FrozenDict[str, Any] = field(default=EMPTY, kw_only=True, converter=_frozen_metadata)

    @property
    def text(self) -> str:
        """The message's text content ("" for none): a ``str`` content itself, or the text
        of its text parts joined by newlines (images and documents are not text: see
        :attr:`parts` and :func:`tinyctx.parts.describe_content`)."""
        return ""

    @property
    def parts(self) -> tuple[Part, ...]:
        """The content as parts (a ``str`` is one text part; none when empty)."""
        return ()

    def describe(self) -> str:
        """The content as plain text with each image or document named in brackets
        (``[image: screenshot image/png 1280×800]``), never its base64: what summaries,
        notes and transcripts read."""
        return self.text

    def evolve(self, **changes: Any) -> Self:
        """A copy with ``changes``; every converter and validator runs again."""
        return attrs.evolve(self, **changes)


@frozen(cache_hash=True)
class SystemMessage(Message):
    content: str = field(validator=instance_of(str))
    role: ClassVar[Role] = "system"

    @property
    def text(self) -> str:
        return self.content

    @property
    def parts(self) -> tuple[Part, ...]:
        return content_parts(self.content)


def _user_content(value: object) -> Content:
    return value if type(value) is str else to_content(value, owner="UserMessage")


def _result_content(value: object) -> Content:
    return value if type(value) is str else to_content(value, owner="ToolResult")


class _PartsContent:
    """``text``, ``parts`` and ``describe`` for messages whose content may hold parts."""

    __slots__ = ()
    if TYPE_CHECKING:
        content: Content

    @property
    def text(self) -> str:
        content = self.content
        return content if type(content) is str else content_text(content)

    @property
    def parts(self) -> tuple[Part, ...]:
        return content_parts(self.content)

    def describe(self) -> str:
        content = self.content
        return content if type(content) is str else describe_content(content)


@frozen(cache_hash=True)
class UserMessage(_PartsContent, Message):
    """A user turn; ``content`` is a ``str`` or a tuple of parts (text, images, documents)."""

    content: Content = field(converter=_user_content)
    role: ClassVar[Role] = "user"


@frozen(cache_hash=True)
class AssistantMessage(Message):
    content: str = field(default="", validator=instance_of(str))
    tool_calls: tuple[ToolCall, ...] = field(default=(), converter=_tuple_of_calls)
    role: ClassVar[Role] = "assistant"

    @property
    def text(self) -> str:
        return self.content

    @property
    def parts(self) -> tuple[Part, ...]:
        return content_parts(self.content)


@frozen(cache_hash=True)
class ToolResult(_PartsContent, Message):
    """A tool's answer to one call; ``content`` is a ``str`` or a tuple of parts."""

    tool_call_id: str = field(validator=_nonempty_str)
    content: Content = field(converter=_result_content)
    name: str = field(default="", validator=instance_of(str))
    is_error: bool = field(default=False, validator=instance_of(bool))
    role: ClassVar[Role] = "tool"

    @classmethod
    def for_call(
        cls,
        call: ToolCall,
        content: Content | Iterable[Part],
        *,
        is_error: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        return cls(call.id, content, call.name, is_error, metadata=frozen_mapping(metadata))


# ---------------------------------------------------------------------------------------
# valid text

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: a surrogate pair written as two code points is joined, a
    lone surrogate (which no UTF-8 encoder accepts) becomes U+FFFD. The same string back
    when it is already valid."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _valid_json(value: Any) -> Any:
    if type(value) is str:
        return valid_text(value)
    if isinstance(value, tuple):
        return tuple(_valid_json(v) for v in value)
    if isinstance(value, Mapping):
        return {valid_text(k): _valid_json(v) for k, v in value.items()}
    return value


def _valid_call(call: ToolCall) -> ToolCall:
    arguments, invalid = call.arguments, call.invalid_arguments
    fixed = _valid_json(arguments)
    fixed_invalid = valid_text(invalid) if invalid is not None else None
    if fixed == arguments and fixed_invalid is invalid:
        return call
    return attrs.evolve(call, arguments=fixed, invalid_arguments=fixed_invalid)


def valid_message(message: Message) -> Message:
    """``message`` with its text (content, tool call arguments) made valid by
    :func:`valid_text`; the same object when it already is. The loop applies it to what
    enters from outside: input, model output and tool results."""
    content = getattr(message, "content", None)
    if type(content) is str and not (isinstance(message, AssistantMessage) and message.tool_calls):
        # the common message, text only: the answer of the general path below, sooner
        fixed = valid_text(content)
        if fixed is content:
            return message
        fixes: dict[str, Any] = {"content": fixed}
        return attrs.evolve(message, **fixes)
    changes: dict[str, Any] = {}
    if isinstance(content, str):
        fixed = valid_text(content)
        if fixed is not content:
            changes["content"] = fixed
    elif isinstance(content, tuple):
        parts = tuple(
            attrs.evolve(p, text=valid_text(p.text))
            if isinstance(p, TextPart) and valid_text(p.text) is not p.text
            else p
            for p in content
        )
        if any(a is not b for a, b in zip(parts, content, strict=True)):
            changes["content"] = parts
    if isinstance(message, AssistantMessage) and message.tool_calls:
        calls = tuple(_valid_call(c) for c in message.tool_calls)
        if any(a is not b for a, b in zip(calls, message.tool_calls, strict=True)):
            changes["tool_calls"] = calls
    return attrs.evolve(message, **changes) if changes else message


# ---------------------------------------------------------------------------------------
# reused tool call ids

RENAMED_IDS = "renamed_ids"
"""Key in ``metadata["tinyctx"]``: ``{new id: original id}`` of calls renamed because their
id was already used (by the loop as a call enters history, by tinyctx.formats on reading)."""


def with_renamed_ids(message: Message, mapping: Mapping[str, str]) -> Message:
    """``message`` with the ids in ``mapping`` (``{new id: original id}``) renamed: an
    assistant message's calls, or a tool result's ``tool_call_id``. The mapping is kept in
    ``metadata["tinyctx"]["renamed_ids"]``."""
    meta = dict(message.metadata)
    own = dict(meta.get("tinyctx") or {})
    own[RENAMED_IDS] = dict(mapping)
    meta["tinyctx"] = own
    if isinstance(message, AssistantMessage):
        new_ids = {original: new for new, original in mapping.items()}
        calls = tuple(
            attrs.evolve(c, id=new_ids[c.id]) if c.id in new_ids else c for c in message.tool_calls
        )
        return attrs.evolve(message, tool_calls=calls, metadata=meta)
    if not isinstance(message, ToolResult):
        raise TypeError(f"only calls and results have ids to rename, not {message.role!r}")
    (new_id,) = mapping
    return attrs.evolve(message, tool_call_id=new_id, metadata=meta)


def call_ids(messages: Iterable[Message]) -> set[str]:
    """Every tool call id ``messages`` use, in calls and in results."""
    used: set[str] = set()
    for message in messages:
        if isinstance(message, AssistantMessage):
            used.update(c.id for c in message.tool_calls)
        elif isinstance(message, ToolResult):
            used.add(message.tool_call_id)
    return used


def fresh_call_ids(message: AssistantMessage, used: set[str]) -> AssistantMessage:
    """``message`` with each call whose id is in ``used`` renamed ``<id>_r<n>`` (the first
    such id not in ``used``; the original kept under ``renamed_ids``). ``used`` gains the
    ids of the message as it returns it."""
    mapping: dict[str, str] = {}
    for call in message.tool_calls:
        if call.id in used:
            count = 2
            while f"{call.id}_r{count}" in used:
                count += 1
            new_id = f"{call.id}_r{count}"
            mapping[new_id] = call.id
            used.add(new_id)
        else:
            used.add(call.id)
    if not mapping:
        return message
    renamed = with_renamed_ids(message, mapping)
    assert isinstance(renamed, AssistantMessage)
    return renamed


_MESSAGE_CLASSES: Final = frozenset({SystemMessage, UserMessage, AssistantMessage, ToolResult})


def check_messages(messages: Sequence[object], what: str = "messages") -> None:
    """Raise TypeError naming ``what[i]``, the first item that is not a :class:`Message`.

    Every model request checks its whole history, so the usual case (only the four
    built-in classes) is one pass in C; a subclass or a stranger takes the loop."""
    if _MESSAGE_CLASSES.issuperset(map(type, messages)):
        return
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise TypeError(f"{what}[{index}] must be a Message, got {type(message).__name__}")


# ---------------------------------------------------------------------------------------
# pairing


def check_pairing(messages: Sequence[Message], *, allow_pending: bool = True) -> None:
    """Raise :class:`PairingError` naming the first orphan in ``messages``.

    An orphan is a tool call without its result before the next assistant message, or a
    tool result that answers no open call. Calls of the *last* assistant message may still
    be waiting for their results (the loop is running them) unless ``allow_pending=False``,
    which is the rule for a request sent to a model.
    """
    open_calls: dict[str, int] = {}  # id -> index of the assistant message
    seen_ids: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            if open_calls:
                call_id, at = next(iter(open_calls.items()))
                raise PairingError(
                    f"orphan tool call {call_id!r} (assistant message {at}) has no result "
                    f"before the next assistant message at index {index}",
                    index=at,
                    tool_call_id=call_id,
                )
            for call in message.tool_calls:
                if call.id in seen_ids:
                    raise PairingError(
                        f"duplicate tool call id {call.id!r} at index {index}",
                        index=index,
                        tool_call_id=call.id,
                    )
                seen_ids.add(call.id)
                open_calls[call.id] = index
        elif isinstance(message, ToolResult) and open_calls.pop(message.tool_call_id, None) is None:
            why = "already answered" if message.tool_call_id in seen_ids else "answers no tool call"
            raise PairingError(
                f"orphan tool result at index {index}: tool_call_id {message.tool_call_id!r} {why}",
                index=index,
                tool_call_id=message.tool_call_id,
            )
    if open_calls and not allow_pending:
        call_id, at = next(iter(open_calls.items()))
        raise PairingError(
            f"orphan tool call {call_id!r} (assistant message {at}) has no result",
            index=at,
            tool_call_id=call_id,
        )


def pending_tool_calls(messages: Sequence[Message]) -> tuple[ToolCall, ...]:
    """Calls of the last assistant message that have no result yet, in call order."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):
            if not message.tool_calls:
                return ()
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolResult)}
            return tuple(c for c in message.tool_calls if c.id not in answered)
    return ()


def answer_pending(
    messages: Sequence[Message], content: str, *, is_error: bool = True, reason: str = ""
) -> tuple[ToolResult, ...]:
    """Results that answer every pending call with ``content``, so pairing holds.

    They are marked ``metadata["tinyctx"]["synthetic"] = reason``: the tool never ran.
    """
    meta = {"tinyctx": {"synthetic": reason or "answered"}}
    return tuple(
        ToolResult.for_call(call, content, is_error=is_error, metadata=meta)
        for call in pending_tool_calls(messages)
    )


@frozen
class ToolTurn:
    """One assistant message with tool calls and the indices of the results answering it."""

    assistant_index: int
    call_ids: tuple[str, ...]
    result_indices: tuple[int, ...]


def tool_turns(messages: Sequence[Message]) -> list[ToolTurn]:
    """Every assistant tool-call turn, oldest first, with where its results are."""
    turns: list[ToolTurn] = []
    owner: dict[str, int] = {}
    results: list[list[int]] = []
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            slot = len(turns)
            turns.append(ToolTurn(index, tuple(c.id for c in message.tool_calls), ()))
            results.append([])
            for call in message.tool_calls:
                owner[call.id] = slot
        elif isinstance(message, ToolResult):
            slot_of = owner.get(message.tool_call_id)
            if slot_of is not None:
                results[slot_of].append(index)
    return [
        ToolTurn(t.assistant_index, t.call_ids, tuple(r))
        for t, r in zip(turns, results, strict=True)
    ]


def safe_boundaries(messages: Sequence[Message]) -> list[bool]:
    """``b[i]`` is True when cutting before index ``i`` separates no call from its result.

    ``len(b) == len(messages) + 1``; ``b[0]`` and ``b[-1]`` are always True.
    """
    n = len(messages)
    # last index that answers a call made at or before position i, per assistant turn
    last_result_for_turn: dict[int, int] = {}
    owner: dict[str, int] = {}
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                owner[call.id] = index
        elif isinstance(message, ToolResult):
            at = owner.get(message.tool_call_id)
            if at is not None:
                last_result_for_turn[at] = index
    # a turn spans [assistant_index, last_result]; a cut at i is unsafe when it falls inside
    unsafe_until = [0] * (n + 1)
    for start, end in last_result_for_turn.items():
        unsafe_until[start + 1] = max(unsafe_until[start + 1], end + 1)
    boundaries = [True] * (n + 1)
    reach = 0
    for i in range(n + 1):
        reach = max(reach, unsafe_until[i])
        if i < reach:
            boundaries[i] = False
    # pending calls at the end: a cut after their assistant message would orphan them
    for index in range(n - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolResult)}
            if any(c.id not in answered for c in message.tool_calls):
                for i in range(index + 1, n):
                    boundaries[i] = False
            break
    return boundaries


def snap_boundary(
    messages: Sequence[Message],
    index: int,
    *,
    direction: Literal["backward", "forward"] = "backward",
    boundaries: Sequence[bool] | None = None,
) -> int:
    """The nearest safe cut to ``index`` in ``direction`` (0 and len are always safe)."""
    n = len(messages)
    index = max(0, min(index, n))
    safe = boundaries if boundaries is not None else safe_boundaries(messages)
    if direction == "backward":
        while index > 0 and not safe[index]:
            index -= 1
    else:
        while index < n and not safe[index]:
            index += 1
    return index
