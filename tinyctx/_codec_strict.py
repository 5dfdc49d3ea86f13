"""The codec's strict reader: every field checked through the constructors; errors name the path."""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import sys
from typing import Any, Final

from ._codec_base import (
    _TOO_DEEP,
    CODEC_VERSION,
    CodecError,
    _fast_loads,
    _join,
    _kind,
)
from .errors import ConfigError
from .frozen import (
    EMPTY,
    MAX_NESTING,
    FrozenDict,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from .parts import Part, part_from_json


def _rebase(prefix: str, exc: CodecError) -> CodecError:
    rel = exc.path
    if not rel:
        path = prefix
    elif rel.startswith("[") or not prefix:
        path = prefix + rel
    else:
        path = f"{prefix}.{rel}"
    return CodecError(path, exc.problem)


def _parse(doc: str | bytes) -> dict[str, Any]:
    if not isinstance(doc, (str, bytes, bytearray)):
        raise CodecError("", f"a document is a str, got {_kind(doc)}")
    try:
        obj = _fast_loads(doc) if isinstance(doc, str) else json.loads(doc)
    except json.JSONDecodeError as exc:
        raise CodecError("", f"not JSON ({exc})") from None
    except RecursionError:
        raise CodecError("", f"too deeply nested to parse: {_TOO_DEEP}") from None
    except UnicodeDecodeError as exc:
        raise CodecError("", f"not a JSON document ({type(exc).__name__})") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise _huge_integer(doc, exc) from None
    return _checked(obj)


class _HugeInteger:
    """Internal: an integer literal too long to convert, where :func:`_huge_integer`
    parses a document again to find it."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _huge_integer(doc: str | bytes, cause: ValueError) -> CodecError:
    """The error for a document holding an integer over ``sys.get_int_max_str_digits()``
    digits (the stdlib parser's bare ``ValueError``), naming the integer's path."""
    limit = sys.get_int_max_str_digits()

    def mark(literal: str) -> int | _HugeInteger:
        digits = len(literal.lstrip("-"))
        return _HugeInteger(digits) if limit and digits > limit else int(literal)

    try:
        obj = json.JSONDecoder(parse_int=mark).decode(
            doc if isinstance(doc, str) else bytes(doc).decode()
        )
    except (ValueError, RecursionError):
        return CodecError("", f"not a JSON document ({cause})")
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(obj, ())]
    while stack:  # iterative: the document may be nested deeply
        value, parts = stack.pop()
        if isinstance(value, _HugeInteger):
            return CodecError(
                _join("", parts),
                f"an integer of {value.digits} digits, over the {limit}-digit limit of "
                "Python's int conversion (sys.set_int_max_str_digits)",
            )
        if isinstance(value, dict):
            stack.extend((item, (*parts, key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, (*parts, i)) for i, item in reversed(list(enumerate(value))))
    return CodecError("", f"not a JSON document ({cause})")


def _checked(obj: Any) -> dict[str, Any]:
    """A parsed document that is an object of this codec version (else CodecError)."""
    if type(obj) is not dict:
        raise CodecError("", f"a document is a JSON object, got {_json_kind(obj)}")
    version = obj.get("v")
    if version != CODEC_VERSION or type(version) is not int:
        _bad_version(version)
    return obj


def _bad_version(version: Any) -> None:
    if version is None:
        raise CodecError("v", "missing schema version")
    if type(version) is not int or version < 1:
        raise CodecError("v", f"schema version {version!r} is not a positive integer")
    raise CodecError(
        "v",
        f"schema version {version} was written by a newer tinyctx "
        f"(this one reads up to version {CODEC_VERSION})",
    )


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), f"{_kind(value)}")


def _unexpected(obj: dict[str, Any], allowed: frozenset[str]) -> CodecError:
    extra = sorted(set(obj) - allowed)[0]
    return CodecError(
        _join("", [extra]), f"unexpected field (allowed: {', '.join(sorted(allowed - {'v'}))})"
    )


def _str(obj: dict[str, Any], key: str, *, nonempty: bool = False) -> str:
    value = obj.get(key)
    if type(value) is not str:
        if key not in obj:
            raise CodecError(key, "missing (a string is required)")
        raise CodecError(key, f"expected a string, got {_json_kind(value)}")
    if nonempty and not value:
        raise CodecError(key, "expected a non-empty string")
    return value


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is not None and type(value) is not str:
        raise CodecError(key, f"expected a string or null, got {_json_kind(value)}")
    return value


def _bool(obj: dict[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if type(value) is not bool:
        raise CodecError(key, f"expected true or false, got {_json_kind(value)}")
    return value


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key, 0)
    if type(value) is not int or value < 0:
        raise CodecError(key, f"expected an integer >= 0, got {value!r}")
    return value


def _frozen_object(obj: dict[str, Any], key: str) -> FrozenDict[str, Any]:
    value = obj.get(key)
    if type(value) is not dict:
        if value is None and key not in obj:
            return EMPTY
        raise CodecError(key, f"expected an object, got {_json_kind(value)}")
    if not value:
        return EMPTY
    frozen: FrozenDict[str, Any] = _frozen_field(key, value)
    return frozen


def _frozen_field(key: str, value: Any) -> Any:
    """``value``, the field ``key``, frozen; nested past the limit: :class:`CodecError`."""
    try:
        return _freeze_json(value)
    except _TooDeep:
        raise CodecError(key, _TOO_DEEP) from None


class _TooDeep(Exception):
    """Internal: a stored value nests deeper than MAX_NESTING; the field is named above."""


def _freeze_json(value: Any, depth: int = 0) -> Any:
    """``freeze`` for what the JSON parser returns (dicts, lists, scalars): no dispatch."""
    t = type(value)
    if t is dict:
        if depth >= MAX_NESTING:
            raise _TooDeep
        depth += 1
        return FrozenDict._wrap({k: _freeze_json(v, depth) for k, v in value.items()})
    if t is list:
        if depth >= MAX_NESTING:
            raise _TooDeep
        depth += 1
        return tuple([_freeze_json(v, depth) for v in value])
    return value


def _array(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if type(value) is not list:
        if value is None and key not in obj:
            return []
        raise CodecError(key, f"expected an array, got {_json_kind(value)}")
    return value


def _each(obj: dict[str, Any], key: str, read: Any) -> tuple[Any, ...]:
    """``read`` applied to every item of the array ``obj[key]``, errors re-based."""
    items = _array(obj, key)
    out = []
    index = 0
    try:
        for index, item in enumerate(items):  # noqa: B007 - read in the handler
            out.append(read(item))
    except CodecError as exc:
        raise _rebase(f"{key}[{index}]", exc) from None
    return tuple(out)


def _object(value: Any, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise CodecError("", f"{what} is an object, got {_json_kind(value)}")
    return value


_CALL_KEYS: Final = frozenset({"id", "name", "arguments", "invalid_arguments"})


def _call_from(value: Any) -> ToolCall:
    obj = _object(value, "a tool call")
    if not obj.keys() <= _CALL_KEYS:
        raise _unexpected(obj, _CALL_KEYS)
    return ToolCall(
        _str(obj, "id", nonempty=True),
        _str(obj, "name", nonempty=True),
        _frozen_object(obj, "arguments"),
        invalid_arguments=_opt_str(obj, "invalid_arguments"),
    )


def _part_from(value: Any) -> Part:
    try:
        return part_from_json(_object(value, "a content part"), path="")
    except ConfigError as exc:
        where = exc.field.lstrip(".")
        raise CodecError(where, f"{exc.value!r} is invalid: allowed {exc.allowed}") from None


def _content(obj: dict[str, Any]) -> Any:
    """A message's content: a string, or a non-empty array of part objects."""
    value = obj.get("content")
    if type(value) is str:
        return value
    if type(value) is list and value:
        return _each(obj, "content", _part_from)
    if "content" not in obj:
        raise CodecError("content", "missing (a string or an array of parts is required)")
    raise CodecError(
        "content", f"expected a string or a non-empty array of parts, got {_json_kind(value)}"
    )


_BASE_KEYS: Final = frozenset({"v", "role", "essential", "metadata"})
_TEXT_KEYS: Final = _BASE_KEYS | {"content"}
_ASSISTANT_KEYS: Final = _BASE_KEYS | {"content", "tool_calls"}
_TOOL_KEYS: Final = _BASE_KEYS | {"content", "tool_call_id", "name", "is_error"}
_ROLES: Final = "system, user, assistant, tool"


def _message_from(value: Any) -> Message:
    obj = _object(value, "a message")
    role = obj.get("role")
    essential = obj.get("essential", True)
    if type(essential) is not bool:
        _bool(obj, "essential", True)
    metadata = _frozen_object(obj, "metadata") if "metadata" in obj else EMPTY
    keys = obj.keys()
    try:
        if role == "user" or role == "system":
            if not keys <= _TEXT_KEYS:
                raise _unexpected(obj, _TEXT_KEYS)
            if role == "system":
                return SystemMessage(_str(obj, "content"), essential=essential, metadata=metadata)
            return UserMessage(_content(obj), essential=essential, metadata=metadata)
        if role == "tool":
            if not keys <= _TOOL_KEYS:
                raise _unexpected(obj, _TOOL_KEYS)
            return ToolResult(
                _str(obj, "tool_call_id", nonempty=True),
                _content(obj),
                _str(obj, "name") if "name" in obj else "",
                _bool(obj, "is_error", False),
                essential=essential,
                metadata=metadata,
            )
        if role == "assistant":
            if not keys <= _ASSISTANT_KEYS:
                raise _unexpected(obj, _ASSISTANT_KEYS)
            return AssistantMessage(
                _str(obj, "content") if "content" in obj else "",
                _each(obj, "tool_calls", _call_from) if "tool_calls" in obj else (),
                essential=essential,
                metadata=metadata,
            )
    except CodecError:
        raise
    except (TypeError, ValueError) as exc:  # e.g. duplicate call ids in one message
        raise CodecError("", str(exc)) from None
    if "role" not in obj:
        raise CodecError("role", f"missing (allowed: {_ROLES})")
    raise CodecError("role", f"{role!r} is not a message role (allowed: {_ROLES})")
