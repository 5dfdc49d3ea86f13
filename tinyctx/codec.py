"""Versioned, canonical JSON documents for every value that crosses a process boundary.

A durable thread stores messages, the checkpoint of an interrupted run and the layers'
state; a worker that resumes the thread may be another process, another machine, another
tinyctx release. This module turns each of those values into a *document* (a ``str``) and
back, with no pickle anywhere:

- **Versioned.** Every top-level document carries ``"v": CODEC_VERSION``. A document from
  a newer tinyctx, or a malformed one, raises :class:`CodecError` naming the path of the
  first problem (``messages[12].tool_calls[0].arguments``); nothing is half built.
- **Canonical.** Equal values give equal bytes: keys sorted, separators ``","`` and
  ``":"``, fields equal to their default left out, tuples and lists both written as
  arrays, and ``ensure_ascii=True``, so every document is pure ASCII and a Python
  string round-trips exactly, lone surrogates included; a non-ASCII character costs a
  ``\\uXXXX`` escape. The one string JSON cannot keep, a surrogate pair written as two code
  points (its escapes read back as the one character they stand for), is refused naming
  its path, as is an integer past 4300 digits (what Python reads back). Values compare
  by type as well: ``1``, ``1.0`` and ``True`` are different JSON and give different
  documents (and decode back to their own type).
- **Small.** A message document holds that message only, so the bytes a step adds do not
  depend on the length of the history.
- **JSON values only** in metadata, tool arguments, run-config mappings, layer state and
  an interrupt's payload:
  ``str``, ``int``, finite ``float``, ``bool``, ``None``, mappings with string keys and
  sequences. Anything else is refused at encoding time, naming its path.
- **Nested at most** :data:`MAX_NESTING` **levels** of objects and arrays in one field's
  value (the field's own mapping counted). The encoder refuses deeper, naming the path, and
  both readers (Python and ``tinyctx._speedups``) hold the same limit, so a stored document
  nested deeper is a :class:`CodecError` when read, never a ``RecursionError``; message,
  call and control constructors refuse deeper values already (``tinyctx.frozen.freeze``).

What a checkpoint carries of its run config is exactly :class:`~tinyctx.RunConfig`'s own
fields; the session strips what the run's context policy hid before it checkpoints, so a
stored checkpoint never holds more than the run could see.
"""

from __future__ import annotations

import inspect
import json
import json.encoder
import json.scanner
import math
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, cast, overload

from ._gc import gc_paused
from .checkpoint import Checkpoint
from .context import RunConfig
from .documents import TEXT_HOLE, SplitDocuments, join_document
from .errors import ConfigError, TinyCtxError, a_type
from .frozen import (
    EMPTY,
    HUGE_INT,
    MAX_NESTING,
    SPLIT_PAIR,
    FrozenDict,
    text_fits,
    value_fits,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from .model import Usage
from .parts import Part, part_from_json

__all__ = [
    "CODEC_VERSION",
    "MAX_NESTING",
    "CodecError",
    "encode",
    "decode",
    "encode_message",
    "decode_message",
    "encode_messages",
    "decode_messages",
    "encode_checkpoint",
    "decode_checkpoint",
    "encode_state",
    "decode_state",
]

CODEC_VERSION: Final = 1
"""The schema version this tinyctx writes (and the newest it reads)."""

T = TypeVar("T")

_INT_BOUND: Final = 1 << 14_000
"""Integers inside (-bound, bound) have at most 4215 digits: no need to count them."""

_TOO_DEEP: Final = (
    f"nested deeper than {MAX_NESTING} levels of objects and arrays "
    "(the most a thread keeps: tinyctx.codec.MAX_NESTING)"
)


class CodecError(TinyCtxError, ValueError):
    """A value that cannot be encoded, or a document that cannot be decoded.

    ``path`` names where (``messages[12].tool_calls[0].arguments``; empty for the whole
    document) and ``problem`` what is wrong there.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path or '<document>'}: {problem}")


_ENCODER = json.JSONEncoder(
    ensure_ascii=True, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_DECODER = json.JSONDecoder()
_orjson_loads: Callable[[str], Any] | None
try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - a dependency; the stdlib parser reads the same
    _orjson_loads = None
_loads = _DECODER.decode
# the C encoder and scanner behind json.dumps/json.loads, built once: the per-call setup
# of JSONEncoder.encode costs as much as encoding a small message
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_scanner = getattr(json.scanner, "c_make_scanner", None)
_dumps: Callable[[dict[str, Any]], str] = _ENCODER.encode
_fast_loads: Callable[[str], Any] = _loads
if _c_encoder is not None and _c_scanner is not None:  # CPython: always
    _encode_chunks = _c_encoder(
        None, None, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, False
    )
    _scan = _c_scanner(_DECODER)

    def _c_dumps(obj: dict[str, Any]) -> str:
        return "".join(_encode_chunks(obj, 0))

    def _c_loads(doc: str) -> Any:
        try:
            value, end = _scan(doc, 0)
        except (StopIteration, ValueError):
            return _loads(doc)  # the full parser reports the error with its position
        return value if end == len(doc) else _loads(doc)

    _dumps = _c_dumps
    _fast_loads = _c_loads


# ---------------------------------------------------------------------------------------
# paths


class _Bad(Exception):
    """Internal: a problem found deep in a value; the path is built while unwinding."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.parts: list[str | int] = []


def _join(base: str, parts: Iterable[str | int]) -> str:
    path = base
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path = f"{path}.{part}" if path else part
        else:
            path += f"[{json.dumps(part)}]"
    return path


def _raise_bad(base: str, bad: _Bad) -> CodecError:
    parts = bad.parts[::-1]
    if len(parts) <= 24:
        return CodecError(_join(base, parts), bad.problem)
    # a path down a deeply nested value: its first and last steps, the count between
    elided = _join(base, parts[:12]) + f"[...{len(parts) - 16} more...]"
    return CodecError(elided + _join("_", parts[-4:])[1:], bad.problem)


# ---------------------------------------------------------------------------------------
# JSON values


def _kind(value: object) -> str:
    """The type of ``value`` with its article: "a dict", "an object"."""
    return a_type(type(value))


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-ready copy of ``value`` (mappings to dicts); ``_Bad`` for anything else
    (``depth``: the levels of objects and arrays around ``value`` within its field)."""
    t = type(value)
    if t is str:
        if value.isascii() or text_fits(value):
            return value
        raise _Bad(f"the string {value!r} {SPLIT_PAIR}")
    if t is bool or value is None:
        return value
    if t is int:
        if -_INT_BOUND < value < _INT_BOUND or value_fits(value):
            return value
        raise _Bad(f"the value {HUGE_INT}")
    if t is float:
        if not math.isfinite(value):
            raise _Bad(f"{value!r} is not a finite number (JSON has no NaN or infinity)")
        return value
    if t is FrozenDict or t is dict or isinstance(value, Mapping):
        if depth >= MAX_NESTING:
            raise _Bad(_TOO_DEEP)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Bad(f"mapping key {key!r} is {_kind(key)}; JSON keys are strings")
            if not (key.isascii() or text_fits(key)):
                raise _Bad(f"the mapping key {key!r} {SPLIT_PAIR}")
            kind = type(item)  # the usual scalars are taken here, without a call
            if (
                (kind is str and item.isascii())
                or (kind is int and -_INT_BOUND < item < _INT_BOUND)
                or kind is bool
                or item is None
            ):
                out[key] = item
                continue
            try:
                out[key] = _plain(item, depth + 1)
            except _Bad as bad:
                bad.parts.append(key)
                raise
        return out
    if t is tuple or t is list:
        if depth >= MAX_NESTING:
            raise _Bad(_TOO_DEEP)
        items = []
        for index, item in enumerate(value):
            kind = type(item)
            if (
                (kind is str and item.isascii())
                or (kind is int and -_INT_BOUND < item < _INT_BOUND)
                or kind is bool
                or item is None
            ):
                items.append(item)
                continue
            try:
                items.append(_plain(item, depth + 1))
            except _Bad as bad:
                bad.parts.append(index)
                raise
        return items
    if isinstance(value, str):
        return _plain(str(value))
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _plain(int(value))
    if isinstance(value, float):
        return _plain(float(value))
    raise _Bad(
        f"{_kind(value)} is not a JSON value "
        "(allowed: str, int, finite float, bool, None, mappings with str keys, sequences)"
    )


# ---------------------------------------------------------------------------------------
# encoding (paths are only built when something is wrong)


def _call_obj(call: ToolCall) -> dict[str, Any]:
    obj: dict[str, Any] = {"id": call.id, "name": call.name}
    if call.arguments:
        try:
            obj["arguments"] = _plain(call.arguments)
        except _Bad as bad:
            bad.parts.append("arguments")
            raise
    if call.invalid_arguments is not None:
        obj["invalid_arguments"] = call.invalid_arguments
    return obj


def _calls_obj(calls: tuple[ToolCall, ...], key: str) -> list[dict[str, Any]]:
    out = []
    for index, call in enumerate(calls):
        try:
            out.append(_call_obj(call))
        except _Bad as bad:
            bad.parts += (index, key)
            raise
    return out


def _message_obj(message: Message) -> dict[str, Any]:
    t = type(message)
    obj: dict[str, Any]
    if t is UserMessage or t is SystemMessage:
        content = cast("UserMessage", message).content
        obj = {
            "role": message.role,
            "content": content if isinstance(content, str) else _parts_obj(content),
        }
    elif t is AssistantMessage:
        assistant = cast("AssistantMessage", message)
        obj = {"role": "assistant"}
        if assistant.content:
            obj["content"] = assistant.content
        if assistant.tool_calls:
            obj["tool_calls"] = _calls_obj(assistant.tool_calls, "tool_calls")
    elif t is ToolResult:
        result = cast("ToolResult", message)
        content = result.content
        obj = {
            "role": "tool",
            "tool_call_id": result.tool_call_id,
            "content": content if isinstance(content, str) else _parts_obj(content),
        }
        if result.name:
            obj["name"] = result.name
        if result.is_error:
            obj["is_error"] = True
    else:
        raise _Bad(
            f"{a_type(t)} cannot be encoded "
            "(allowed: SystemMessage, UserMessage, AssistantMessage, ToolResult)"
        )
    if not message.essential:
        obj["essential"] = False
    if message.metadata:
        try:
            obj["metadata"] = _plain(message.metadata)
        except _Bad as bad:
            bad.parts.append("metadata")
            raise
    return obj


def _parts_obj(parts: tuple[Part, ...]) -> list[Any]:
    """Content parts as their canonical JSON objects (:meth:`TextPart.to_json` and co.)."""
    out = []
    for index, part in enumerate(parts):
        try:
            out.append(_plain(part.to_json()))
        except _Bad as bad:
            bad.parts += (index, "content")
            raise
        except AttributeError:
            wrong = _Bad(f"{_kind(part)} is not a content part (TextPart, ImagePart, DocumentPart)")
            wrong.parts += (index, "content")
            raise wrong from None
    return out


def _messages_obj(messages: Iterable[Message], key: str) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(messages):
        try:
            out.append(_message_obj(message))
        except _Bad as bad:
            bad.parts += (index, key)
            raise
    return out


def _usage_obj(usage: Usage) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
    }
    if usage.context_window is not None:
        obj["context_window"] = usage.context_window
    if usage.reasoning_tokens:
        obj["reasoning_tokens"] = usage.reasoning_tokens
    return obj


_CONFIG_FIELDS: Final = (
    "run_id",
    "thread_id",
    "parent_run_id",
    "root_run_id",
    "lineage",
    "user_id",
    "agent_run_id",
    "tags",
    "metadata",
    "configurable",
    "depth",
    "max_depth",
    "max_model_calls",
    "max_tool_calls",
    "model",
    "max_tokens",
    "reserved_output_tokens",
)
_CONFIG_MAPPINGS: Final = frozenset({"metadata", "configurable"})
_CONFIG_SEQUENCES: Final = frozenset({"lineage", "tags"})


def _config_obj(config: RunConfig) -> dict[str, Any]:
    """RunConfig's own fields (what a resume needs); empty mappings and tuples left out."""
    obj: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        value = getattr(config, name)
        if name in _CONFIG_MAPPINGS or name in _CONFIG_SEQUENCES:
            if value:
                try:
                    obj[name] = _plain(value)
                except _Bad as bad:
                    bad.parts.append(name)
                    raise
        else:
            obj[name] = value  # None included: some defaults are not None (max_model_calls)
    return obj


def _state_obj(state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise _Bad(f"layer state is a mapping of layer names, got {_kind(state)}")
    plain: dict[str, Any] = _plain(state)
    return plain


def _nested(key: str, build: Any, value: Any) -> Any:
    try:
        return build(value)
    except _Bad as bad:
        bad.parts.append(key)
        raise


def _checkpoint_obj(checkpoint: Checkpoint) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "run_config": _nested("run_config", _config_obj, checkpoint.run_config),
        "phase": checkpoint.phase,
        "pending": _calls_obj(checkpoint.pending, "pending"),
        "node": checkpoint.node,
        "message": checkpoint.message,
        "messages": _messages_obj(checkpoint.messages, "messages"),
        "added": _messages_obj(checkpoint.added, "added"),
        "model_calls": checkpoint.model_calls,
        "tool_calls": checkpoint.tool_calls,
        "usage": _usage_obj(checkpoint.usage),
    }
    if checkpoint.state:
        obj["state"] = _nested("state", _state_obj, checkpoint.state)
    if checkpoint.payload is not None:
        obj["payload"] = _nested("payload", _plain, checkpoint.payload)
    return obj


def _document(build: Any, value: Any, base: str = "") -> str:
    try:
        obj = build(value)
    except _Bad as bad:
        raise _raise_bad(base, bad) from None
    obj["v"] = CODEC_VERSION
    try:
        return _dumps(obj)
    except (TypeError, ValueError) as exc:  # a field of the wrong type slipped past attrs
        raise CodecError(base, f"not encodable as JSON ({exc})") from None


def encode_message(message: Message) -> str:
    """The document of one message (its metadata, essential flag and tool calls included)."""
    return _document(_message_obj, message)


def encode_messages(
    messages: Iterable[Message], *, path: str = "messages", start: int = 0
) -> tuple[str, ...]:
    """One document per message; an error names ``messages[i]`` and below (``path`` and
    ``start`` name the sequence and the first message's index: ``input[0]``,
    ``conversation[512]``)."""
    return tuple(
        _document(_message_obj, message, f"{path}[{index}]")
        for index, message in enumerate(messages, start)
    )


def encode_checkpoint(checkpoint: Checkpoint) -> str:
    """The document of an interrupted run's checkpoint, layer state included."""
    if not isinstance(checkpoint, Checkpoint):
        raise CodecError("", f"expected a Checkpoint, got {_kind(checkpoint)}")
    return _document(_checkpoint_obj, checkpoint)


def encode_state(state: Mapping[str, Any]) -> str:
    """The document of layer state: a mapping of layer names to JSON values."""
    return _document(_state_document, state)


def _state_document(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"state": _nested("state", _state_obj, state)}


def encode(value: Message | ToolCall | Usage | RunConfig | Checkpoint | Mapping[str, Any]) -> str:
    """The document of any value the codec knows; a mapping is layer state."""
    if isinstance(value, Message):
        return encode_message(value)
    if isinstance(value, Checkpoint):
        return encode_checkpoint(value)
    if isinstance(value, ToolCall):
        return _document(_call_obj, value)
    if isinstance(value, Usage):
        return _document(_usage_obj, value)
    if isinstance(value, RunConfig):
        return _document(_config_obj, value)
    if isinstance(value, Mapping):
        return encode_state(value)
    raise CodecError(
        "",
        f"{_kind(value)} cannot be encoded (allowed: a Message, ToolCall, Usage, RunConfig, "
        "Checkpoint or a mapping of layer state)",
    )


# ---------------------------------------------------------------------------------------
# decoding: helpers name paths relative to the object they read; a caller that nests
# them re-bases the path of an error (only then: decoding builds no path strings)


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


# The fast reader builds messages without their attrs __init__ (the constructors' own
# converters and validators cost as much as parsing the JSON): it checks every field
# itself and falls back to the strict reader (which uses the constructors) on any doubt.
# It is only enabled while the message classes have exactly the fields it sets.
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


def _c_reader() -> Callable[[Sequence[Any]], list[Message | None]] | None:
    """The fast reader in C (``tinyctx._speedups``), given this reader's classes, slots and
    key sets; None where it was not built (no C compiler at install), where
    ``TINYCTX_NO_EXTENSIONS`` is set, or where the fast reader is off."""
    if not _FAST or os.environ.get("TINYCTX_NO_EXTENSIONS"):
        return None
    try:
        from . import _speedups
    except ImportError:  # pragma: no cover - installed where no C compiler was found
        return None
    _speedups.configure(
        empty=EMPTY,
        frozen_dict=(FrozenDict, _slots(FrozenDict, ("_data", "_hash", "_json_chars"))),
        tool_call=(ToolCall, _CALL_SLOTS),
        tool_result=(ToolResult, _TOOL_SLOTS),
        assistant=(AssistantMessage, _ASSISTANT_SLOTS),
        user=(UserMessage, _USER_SLOTS),
        system=(SystemMessage, _SYSTEM_SLOTS),
        tool_keys=_TOOL_KEYS,
        assistant_keys=_ASSISTANT_KEYS,
        text_keys=_TEXT_KEYS,
        call_keys=_CALL_KEYS,
        version=CODEC_VERSION,
        text_hole=TEXT_HOLE,
        max_depth=MAX_NESTING,
    )
    return _speedups.read_rows


_read_rows: Final = _c_reader()
C_READER: Final = _read_rows is not None
"""Whether :func:`decode_messages` builds messages in C (``tinyctx._speedups``, compiled at
install where a C compiler is found; ``TINYCTX_NO_EXTENSIONS=1`` turns it off). The results
are the same either way; a long thread decodes about 3.5 times as fast with it."""


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


def _decode_message(doc: str | bytes) -> Message:
    # orjson parses a long thread about twice as fast as the stdlib. Its result is what the
    # stdlib would read unless it holds a float past 64 bits (an integer literal there):
    # the fast reader refuses those as it goes; the strict one (content parts, errors) gets
    # the same parsed object after a check, so no document is parsed twice but those, and
    # documents orjson refuses go to the stdlib parser, which names the problem
    if _orjson_loads is not None and _FAST and type(doc) is str:
        try:
            obj = _orjson_loads(doc)
        except ValueError:
            pass
        else:
            message = _from_parsed(obj)
            if message is not None:
                return message
    return _read_message(_parse(doc))


def _from_parsed(obj: Any) -> Message | None:
    """The message of what orjson parsed: the fast reader, else the strict one; None when
    the stdlib must parse the text again (a float past 64 bits may be an integer there)."""
    if type(obj) is dict and obj.get("v") == CODEC_VERSION and type(obj["v"]) is int:
        try:
            return _fast_message(obj)
        except _FAST_FAILURES:
            pass
    try:
        doubtful = _has_big_float(obj)
    except RecursionError:
        doubtful = True
    return None if doubtful else _message_from(_checked(obj))


def decode_message(doc: str | bytes) -> Message:
    """The message a document holds; :class:`CodecError` naming the path otherwise."""
    return _decode_message(doc)


def decode_messages(docs: Sequence[str | bytes], *, path: str = "messages") -> tuple[Message, ...]:
    """The messages of several documents; an error names ``messages[i]`` and below."""
    rows: Sequence[tuple[str, str | None] | str | bytes] = (
        docs.rows if type(docs) is SplitDocuments else docs
    )
    index = 0
    try:
        with gc_paused(len(docs)):  # thousands of acyclic objects: see tinyctx._gc
            if _read_rows is None:
                out = []
                for index, row in enumerate(rows):  # noqa: B007 - read in the handler
                    out.append(_decode_row(row))
                return tuple(out)
            # the C reader answers None where it is not sure; the Python reader decides there
            built = _read_rows(rows)
            for index, message in enumerate(built):
                if message is None:
                    built[index] = _decode_row(rows[index])
            return tuple(built)  # type: ignore[arg-type] # no None is left
    except CodecError as exc:
        raise _rebase(f"{path}[{index}]", exc) from None


def _decode_row(row: tuple[str, str | None] | str | bytes) -> Message:
    """A stored document, or a split one's ``(head, text)``, by the Python reader."""
    if type(row) is tuple:
        head, text = row
        return _decode_message(head) if text is None else _decode_split(head, text)
    return _decode_message(row)  # type: ignore[arg-type] # a str or bytes document


def _decode_split(head: str, text: str) -> Message:
    """The message of a split document: the head parsed, the text put in its hole, then
    read as a whole document's object is (same result, same errors); the joined document
    goes the usual way when orjson cannot have the last word (a repeated ``content`` key,
    a number the stdlib must read, text orjson refuses)."""
    if not head.startswith(TEXT_HOLE):
        raise CodecError("", f"a split document's head must start with {TEXT_HOLE!r}")
    if _orjson_loads is not None and _FAST:
        try:
            obj = _orjson_loads(head)
        except ValueError:
            pass
        else:
            if obj["content"] is None:  # else a repeated key: the whole document decides
                obj["content"] = text
                message = _from_parsed(obj)
                if message is not None:
                    return message
    return _decode_message(join_document(head, text))


_USAGE_KEYS: Final = frozenset(
    {"v", "input_tokens", "output_tokens", "cached_tokens", "context_window", "reasoning_tokens"}
)


def _usage_from(value: Any) -> Usage:
    obj = _object(value, "usage")
    if not obj.keys() <= _USAGE_KEYS:
        raise _unexpected(obj, _USAGE_KEYS)
    window = obj.get("context_window")
    if window is not None and type(window) is not int:
        raise CodecError("context_window", f"expected an integer or null, got {window!r}")
    return Usage(
        _count(obj, "input_tokens"),
        _count(obj, "output_tokens"),
        _count(obj, "cached_tokens"),
        context_window=window,
        reasoning_tokens=_count(obj, "reasoning_tokens"),
    )


_CONFIG_KEYS: Final = frozenset(_CONFIG_FIELDS) | {"v"}
_CONFIG_REQUIRED: Final = ("run_id", "thread_id", "root_run_id")


def _string_item(value: Any) -> str:
    if type(value) is not str:
        raise CodecError("", f"expected a string, got {_json_kind(value)}")
    return value


def _config_from(value: Any) -> RunConfig:
    obj = _object(value, "a run config")
    if not obj.keys() <= _CONFIG_KEYS:
        raise _unexpected(obj, _CONFIG_KEYS)
    for name in _CONFIG_REQUIRED:
        if name not in obj:
            raise CodecError(name, "missing (a string is required)")
    values: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        if name not in obj:
            continue
        if name in _CONFIG_MAPPINGS:
            values[name] = _frozen_object(obj, name)
        elif name in _CONFIG_SEQUENCES:
            values[name] = _each(obj, name, _string_item)
        else:
            values[name] = obj[name]
    _opt_str(obj, "model")
    try:
        return RunConfig(**values)
    except ConfigError as exc:
        raise CodecError(exc.field, f"{exc.value!r} is invalid: allowed {exc.allowed}") from None
    except (TinyCtxError, TypeError, ValueError) as exc:
        raise CodecError("", str(exc)) from None


_CHECKPOINT_KEYS: Final = frozenset(
    {
        "v",
        "run_config",
        "phase",
        "pending",
        "node",
        "message",
        "messages",
        "added",
        "model_calls",
        "tool_calls",
        "usage",
        "state",
        "payload",
    }
)
_PHASES: Final = ("before_model", "tools")


def _field(obj: dict[str, Any], key: str, read: Any, *, required: bool = True) -> Any:
    if key not in obj and required:
        raise CodecError(key, "missing")
    try:
        return read(obj.get(key, {}))
    except CodecError as exc:
        raise _rebase(key, exc) from None


def _checkpoint_from(value: Any) -> Checkpoint:
    obj = _object(value, "a checkpoint")
    if not obj.keys() <= _CHECKPOINT_KEYS:
        raise _unexpected(obj, _CHECKPOINT_KEYS)
    phase = obj.get("phase")
    if phase not in _PHASES:
        raise CodecError("phase", f"{phase!r} is not a phase (allowed: {', '.join(_PHASES)})")
    return Checkpoint(
        run_config=_field(obj, "run_config", _config_from),
        phase=phase,
        pending=_each(obj, "pending", _call_from),
        node=_str(obj, "node"),
        message=_str(obj, "message"),
        messages=_each(obj, "messages", _read_message),
        added=_each(obj, "added", _read_message),
        model_calls=_count(obj, "model_calls"),
        tool_calls=_count(obj, "tool_calls"),
        usage=_field(obj, "usage", _usage_from, required=False),
        state=_frozen_object(obj, "state"),
        payload=_frozen_field("payload", obj.get("payload")),
    )


def decode_checkpoint(doc: str | bytes) -> Checkpoint:
    """The checkpoint a document holds; :class:`CodecError` naming the path otherwise."""
    checkpoint: Checkpoint = _checkpoint_from(_parse(doc))
    return checkpoint


_STATE_KEYS: Final = frozenset({"v", "state"})


def _state_from(value: Any) -> FrozenDict[str, Any]:
    obj = _object(value, "layer state")
    if not obj.keys() <= _STATE_KEYS:
        raise _unexpected(obj, _STATE_KEYS)
    return _frozen_object(obj, "state")


def decode_state(doc: str | bytes) -> FrozenDict[str, Any]:
    """The layer state a document holds (layer name to deep-frozen JSON value)."""
    return _state_from(_parse(doc))


def _call_document(obj: dict[str, Any]) -> ToolCall:
    del obj["v"]
    return _call_from(obj)


_READERS: Final[dict[Any, Any]] = {
    Checkpoint: _checkpoint_from,
    ToolCall: _call_document,
    Usage: _usage_from,
    RunConfig: _config_from,
    FrozenDict: _state_from,
    Mapping: _state_from,
    dict: _state_from,
}


@overload
def decode(doc: str | bytes, kind: type[Checkpoint]) -> Checkpoint: ...
@overload
def decode(doc: str | bytes, kind: type[ToolCall]) -> ToolCall: ...
@overload
def decode(doc: str | bytes, kind: type[Usage]) -> Usage: ...
@overload
def decode(doc: str | bytes, kind: type[RunConfig]) -> RunConfig: ...
@overload
def decode(doc: str | bytes, kind: type[T]) -> T: ...
def decode(doc: str | bytes, kind: Any) -> Any:
    """The value of type ``kind`` a document holds; the inverse of :func:`encode`.

    ``kind`` is a message type (the role must match), ``ToolCall``, ``Usage``,
    ``RunConfig``, ``Checkpoint``, or ``FrozenDict``/``Mapping``/``dict`` for layer state.
    """
    if isinstance(kind, type) and issubclass(kind, Message):
        message = decode_message(doc)
        if not isinstance(message, kind):
            raise CodecError(
                "role",
                f"expected a {kind.__name__}, the document holds a {type(message).__name__}",
            )
        return message
    read = _READERS.get(kind)
    if read is None:
        raise TypeError(
            f"decode: cannot decode a {getattr(kind, '__name__', kind)!r} (allowed: a Message "
            "type, ToolCall, Usage, RunConfig, Checkpoint, FrozenDict for layer state)"
        )
    return read(_parse(doc))
