"""The codec's fast Python reader.

Messages built without their constructors, every field checked here; any doubt falls
back to the strict reader.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, Final

from ._codec_strict import (
    _ASSISTANT_KEYS,
    _CALL_KEYS,
    _TEXT_KEYS,
    _TOOL_KEYS,
    _message_from,
)
from .frozen import (
    EMPTY,
    MAX_NESTING,
    FrozenDict,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage

_new = object.__new__
_HASH_SLOT: Final = "_attrs_cached_hash"


def _fields_are(cls: type, names: set[str]) -> bool:
    import attrs

    return {a.name for a in attrs.fields(cls)} == names and _HASH_SLOT in getattr(
        cls, "__slots__", ()
    )


_TRUSTED: Final = (
    _fields_are(ToolCall, {"id", "name", "arguments", "invalid_arguments"})
    and _fields_are(UserMessage, {"essential", "metadata", "content"})
    and _fields_are(SystemMessage, {"essential", "metadata", "content"})
    and _fields_are(AssistantMessage, {"essential", "metadata", "content", "tool_calls"})
    and _fields_are(
        ToolResult, {"essential", "metadata", "tool_call_id", "content", "name", "is_error"}
    )
)


_BIG_FLOAT: Final = float(1 << 63)
"""orjson reads an integer literal beyond 64 bits as a float: such a float sends the
document to the stdlib parser, which keeps the integer (and reads real floats alike)."""


_wrap: Final = FrozenDict._wrap


def _freeze_object(value: dict[str, Any], depth: int) -> FrozenDict[str, Any]:
    """``_freeze_json`` of a parsed object (``depth`` levels down its field: 1 for the
    field's own object) for the fast reader: a flat object (most tool arguments, most
    metadata) is adopted as it is, without copying."""
    for item in value.values():
        kind = type(item)
        if kind is dict or kind is list or kind is float:
            return _wrap({k: _freeze_value(v, depth) for k, v in value.items()})
    return _wrap(value)


def _freeze_value(value: Any, depth: int) -> Any:
    """An item of a container ``depth`` levels down its field; past the nesting limit
    :class:`_Slow` (the strict reader names the field)."""
    kind = type(value)
    if kind is dict:
        if depth >= MAX_NESTING:
            raise _Slow
        return _freeze_object(value, depth + 1)
    if kind is list:
        if depth >= MAX_NESTING:
            raise _Slow
        depth += 1
        return tuple([_freeze_value(v, depth) for v in value])
    if kind is float and not -_BIG_FLOAT < value < _BIG_FLOAT:
        raise _Slow
    return value


_Setter = Callable[[Any, Any], None]


def _slots(cls: type, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The member descriptors of ``cls``'s slots ``names`` (``()`` unless each is one): the
    fast readers fill a message through them, the Python one with their ``__set__`` (what
    ``object.__setattr__`` ends up calling, minus the lookup through the class), the C one
    at their offsets."""
    found = tuple(inspect.getattr_static(cls, name, None) for name in names)
    return found if all(type(d) is types.MemberDescriptorType for d in found) else ()


def _setters(slots: tuple[Any, ...]) -> tuple[_Setter, ...]:
    return tuple(slot.__set__ for slot in slots)


def _no_setter(target: Any, value: Any) -> None:  # pragma: no cover - _FAST is off then
    raise _Slow


def _unpacked(setters: tuple[_Setter, ...], count: int) -> tuple[_Setter, ...]:
    """The setters to unpack into module constants (never called unless ``_FAST``)."""
    return setters if len(setters) == count else (_no_setter,) * count


_BASE_SLOTS: Final = ("essential", "metadata", _HASH_SLOT)
_CALL_SLOTS: Final = _slots(ToolCall, ("id", "name", "arguments", "invalid_arguments", _HASH_SLOT))
_TOOL_SLOTS: Final = _slots(
    ToolResult, ("tool_call_id", "content", "name", "is_error", *_BASE_SLOTS)
)
_ASSISTANT_SLOTS: Final = _slots(AssistantMessage, ("content", "tool_calls", *_BASE_SLOTS))
_USER_SLOTS: Final = _slots(UserMessage, ("content", *_BASE_SLOTS))
_SYSTEM_SLOTS: Final = _slots(SystemMessage, ("content", *_BASE_SLOTS))
_CALL_SETTERS: Final = _setters(_CALL_SLOTS)
_TOOL_SETTERS: Final = _setters(_TOOL_SLOTS)
_ASSISTANT_SETTERS: Final = _setters(_ASSISTANT_SLOTS)
_USER_SETTERS: Final = _setters(_USER_SLOTS)
_SYSTEM_SETTERS: Final = _setters(_SYSTEM_SLOTS)
_FAST: Final = _TRUSTED and all(
    (_CALL_SETTERS, _TOOL_SETTERS, _ASSISTANT_SETTERS, _USER_SETTERS, _SYSTEM_SETTERS)
)
# the slots' setters as constants: unpacking a tuple per message costs as much as a field
_SET_CALL_ID, _SET_CALL_NAME, _SET_CALL_ARGUMENTS, _SET_CALL_INVALID, _SET_CALL_HASH = _unpacked(
    _CALL_SETTERS, 5
)
(
    _SET_TOOL_ID,
    _SET_TOOL_CONTENT,
    _SET_TOOL_NAME,
    _SET_TOOL_ERROR,
    _SET_TOOL_ESSENTIAL,
    _SET_TOOL_METADATA,
    _SET_TOOL_HASH,
) = _unpacked(_TOOL_SETTERS, 7)
(
    _SET_ASSISTANT_CONTENT,
    _SET_ASSISTANT_CALLS,
    _SET_ASSISTANT_ESSENTIAL,
    _SET_ASSISTANT_METADATA,
    _SET_ASSISTANT_HASH,
) = _unpacked(_ASSISTANT_SETTERS, 5)


"""Whether :func:`decode_messages` builds messages in C (``tinyctx._speedups``, compiled at
install where a C compiler is found; ``TINYCTX_NO_EXTENSIONS=1`` turns it off). The results
are the same either way; a long thread decodes 1.3 to 1.6 times as fast with it
(benchmarks/bench_codec_reader.py)."""


def _fast_mapping(value: Any) -> FrozenDict[str, Any]:
    """A message's metadata or a call's arguments (``EMPTY`` when absent) for the fast
    reader."""
    if value is EMPTY:
        return EMPTY  # type: ignore[no-any-return]
    if type(value) is not dict:
        raise _Slow
    return _freeze_object(value, 1) if value else EMPTY


def _fill_base(
    message: Message,
    obj: dict[str, Any],
    set_essential: _Setter,
    set_metadata: _Setter,
    set_hash: _Setter,
) -> Message:
    """The fields every message has: the essential flag, metadata, no hash yet."""
    essential = obj.get("essential", True)
    if type(essential) is not bool:
        raise _Slow
    set_essential(message, essential)
    set_metadata(message, _fast_mapping(obj.get("metadata", EMPTY)))
    set_hash(message, None)
    return message


def _fast_call(obj: Any) -> ToolCall:
    if type(obj) is not dict:
        raise _Slow
    # id, name and arguments (the usual call) need no look at the keys beyond these
    usual = len(obj) == 3 and "arguments" in obj
    if not usual and not obj.keys() <= _CALL_KEYS:
        raise _Slow
    call_id = obj["id"]
    name = obj["name"]
    invalid = None if usual else obj.get("invalid_arguments")
    if (
        type(call_id) is not str
        or type(name) is not str
        or not call_id
        or not name
        or (invalid is not None and type(invalid) is not str)
    ):
        raise _Slow
    arguments = _fast_mapping(obj.get("arguments", EMPTY))
    call = _new(ToolCall)
    _SET_CALL_ID(call, call_id)
    _SET_CALL_NAME(call, name)
    _SET_CALL_ARGUMENTS(call, arguments)
    _SET_CALL_INVALID(call, invalid)
    _SET_CALL_HASH(call, None)
    return call


def _fast_tool(obj: dict[str, Any]) -> Message:
    if not obj.keys() <= _TOOL_KEYS:
        raise _Slow
    call_id = obj["tool_call_id"]
    content = obj["content"]
    name = obj.get("name", "")
    is_error = obj.get("is_error", False)
    if (
        type(call_id) is not str
        or not call_id
        or type(content) is not str
        or type(name) is not str
        or type(is_error) is not bool
    ):
        raise _Slow
    message = _new(ToolResult)
    _SET_TOOL_ID(message, call_id)
    _SET_TOOL_CONTENT(message, content)
    _SET_TOOL_NAME(message, name)
    _SET_TOOL_ERROR(message, is_error)
    return _fill_base(message, obj, _SET_TOOL_ESSENTIAL, _SET_TOOL_METADATA, _SET_TOOL_HASH)


def _fast_assistant(obj: dict[str, Any]) -> Message:
    if not obj.keys() <= _ASSISTANT_KEYS:
        raise _Slow
    content = obj.get("content", "")
    calls = obj.get("tool_calls")
    if type(content) is not str:
        raise _Slow
    if calls is None:
        if "tool_calls" in obj:
            raise _Slow
        tool_calls: tuple[ToolCall, ...] = ()
    elif type(calls) is list:
        if len(calls) == 1:
            tool_calls = (_fast_call(calls[0]),)
        else:
            tool_calls = tuple([_fast_call(call) for call in calls])
            if len({c.id for c in tool_calls}) != len(tool_calls):
                raise _Slow
    else:
        raise _Slow
    message = _new(AssistantMessage)
    _SET_ASSISTANT_CONTENT(message, content)
    _SET_ASSISTANT_CALLS(message, tool_calls)
    return _fill_base(
        message, obj, _SET_ASSISTANT_ESSENTIAL, _SET_ASSISTANT_METADATA, _SET_ASSISTANT_HASH
    )


def _fast_text(obj: dict[str, Any], cls: type[Message], setters: tuple[_Setter, ...]) -> Message:
    if not obj.keys() <= _TEXT_KEYS:
        raise _Slow
    content = obj["content"]
    if type(content) is not str:
        raise _Slow
    set_content, set_essential, set_metadata, set_hash = setters
    message = _new(cls)
    set_content(message, content)
    return _fill_base(message, obj, set_essential, set_metadata, set_hash)


def _fast_message(obj: dict[str, Any]) -> Message:
    """The message of a well-formed object; on any doubt :class:`_Slow` (or a lookup error)."""
    role = obj["role"]
    if role == "tool":
        return _fast_tool(obj)
    if role == "assistant":
        return _fast_assistant(obj)
    if role == "user":
        return _fast_text(obj, UserMessage, _USER_SETTERS)
    if role == "system":
        return _fast_text(obj, SystemMessage, _SYSTEM_SETTERS)
    raise _Slow


class _Slow(Exception):
    """Internal: the fast reader is unsure; the strict one names the problem."""


_FAST_FAILURES: Final = (_Slow, KeyError, TypeError, ValueError, AttributeError)


def _read_message(obj: dict[str, Any]) -> Message:
    if _FAST:
        try:
            return _fast_message(obj)
        except _FAST_FAILURES:
            pass
    return _message_from(obj)  # the strict reader: raises naming the path


def _has_big_float(value: Any) -> bool:
    kind = type(value)
    if kind is dict:
        return any(map(_has_big_float, value.values()))
    if kind is list:
        return any(map(_has_big_float, value))
    return kind is float and not -_BIG_FLOAT < value < _BIG_FLOAT
