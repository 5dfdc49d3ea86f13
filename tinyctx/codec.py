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

from collections.abc import Mapping, Sequence
from typing import Any, Final, overload

from . import _codec_base, _codec_encode
from ._codec_base import (
    CODEC_VERSION,
    CodecError,
    T,
    _orjson_loads,
)
from ._codec_c import (
    C_READER,
    _read_rows,
)
from ._codec_encode import (
    _CONFIG_FIELDS,
    _CONFIG_MAPPINGS,
    _CONFIG_SEQUENCES,
    StateEncoder,
    encode,
    encode_checkpoint,
    encode_message,
    encode_messages,
    encode_state,
)
from ._codec_fast import (
    _FAST,
    _FAST_FAILURES,
    _fast_message,
    _has_big_float,
    _read_message,
)
from ._codec_strict import (
    _call_from,
    _checked,
    _count,
    _each,
    _frozen_field,
    _frozen_object,
    _json_kind,
    _message_from,
    _object,
    _opt_str,
    _parse,
    _rebase,
    _str,
    _unexpected,
)
from ._gc import gc_paused
from .checkpoint import Checkpoint
from .context import RunConfig
from .documents import TEXT_HOLE, SplitDocuments, join_document
from .errors import ConfigError, TinyCtxError
from .frozen import (
    MAX_NESTING,
    FrozenDict,
)
from .messages import Message, ToolCall
from .model import Usage
from .reexport import publish

publish(__name__, _codec_base, _codec_encode)

__all__ = [
    "CODEC_VERSION",
    "C_READER",
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
    "StateEncoder",
]


def _decode_message(doc: str | bytes) -> Message:
    # orjson parses a long thread about 2.4 times as fast as the stdlib (bench_codec_reader).
    # Its result is what the stdlib would read unless it holds a float past 64 bits (an
    # integer literal there): the fast reader refuses those as it goes; the strict one
    # (content parts, errors) gets the same parsed object after a check, so no document is
    # parsed twice but those, and documents orjson refuses go to the stdlib parser, which
    # names the problem
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
