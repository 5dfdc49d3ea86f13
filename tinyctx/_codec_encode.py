"""The codec's writer: canonical JSON documents of messages, checkpoints and layer state."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

from ._codec_base import (
    _INT_BOUND,
    _TOO_DEEP,
    CODEC_VERSION,
    CodecError,
    _Bad,
    _dumps,
    _kind,
    _raise_bad,
)
from .checkpoint import Checkpoint
from .context import RunConfig
from .errors import a_type
from .frozen import (
    HUGE_INT,
    MAX_NESTING,
    SPLIT_PAIR,
    FrozenDict,
    text_fits,
    value_fits,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from .model import Usage
from .parts import Part


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


class StateEncoder:
    """:func:`encode_state` for one thread's successive writes: the same document, bytes
    for bytes, but a :class:`~tinyctx.frozen.FrozenDict` (immutable) that the previous
    document held, the same object again, is not checked and encoded again.

    A layer state that keeps its entries as frozen mappings (the thread's usage record,
    one per run) then costs a write what changed in it, not all it keeps. The memo holds
    the frozen mappings of the last document only (alive, so their ids stay theirs)."""

    __slots__ = ("_fresh", "_memo")

    def __init__(self) -> None:
        # id -> (the frozen mapping, the depth it was at, its text)
        self._memo: dict[int, tuple[FrozenDict[Any, Any], int, str]] = {}
        self._fresh: dict[int, tuple[FrozenDict[Any, Any], int, str]] = {}

    def encode(self, state: Mapping[str, Any]) -> str:
        """The document of ``state``, as :func:`encode_state` writes it."""
        given: object = state
        if not isinstance(given, Mapping):
            return encode_state(state)  # refused, naming what it got
        self._fresh = {}
        try:
            body = self._value(state, 0)
        except _Bad:
            self._fresh = {}
            return encode_state(state)  # raises the error naming its path
        self._memo, self._fresh = self._fresh, {}
        return f'{{"state":{body},"v":{_json_text(CODEC_VERSION)}}}'

    def _value(self, value: Any, depth: int) -> str:
        """The text of ``value`` (``depth``: the objects and arrays around it)."""
        t = type(value)
        if t is FrozenDict:
            hit = self._memo.get(id(value))
            if hit is None or hit[0] is not value or hit[1] != depth:
                hit = (value, depth, _json_text(_plain(value, depth)))
            self._fresh[id(value)] = hit
            return hit[2]
        if t is dict or (isinstance(value, Mapping) and t is not FrozenDict):
            if all(type(item) in _SCALARS for item in value.values()):
                return _json_text(_plain(value, depth))  # nothing in it to look up
            if depth >= MAX_NESTING:
                raise _Bad(_TOO_DEEP)
            parts = []
            for key in sorted(value, key=_sort_key):
                if not (key.isascii() or text_fits(key)):
                    raise _Bad(f"the mapping key {key!r} {SPLIT_PAIR}")
                parts.append(f"{_json_text(key)}:{self._value(value[key], depth + 1)}")
            return "{" + ",".join(parts) + "}"
        if t is list or t is tuple:
            if depth >= MAX_NESTING:
                raise _Bad(_TOO_DEEP)
            memo, fresh, inner = self._memo, self._fresh, depth + 1
            parts = []
            for item in value:  # a frozen entry the last document held: looked up here
                hit = memo.get(id(item)) if type(item) is FrozenDict else None
                if hit is not None and hit[0] is item and hit[1] == inner:
                    fresh[id(item)] = hit
                    parts.append(hit[2])
                else:
                    parts.append(self._value(item, inner))
            return "[" + ",".join(parts) + "]"
        return _json_text(_plain(value, depth))


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _sort_key(key: Any) -> str:
    if type(key) is not str:
        raise _Bad(f"mapping key {key!r} is {_kind(key)}; JSON keys are strings")
    return key


def _json_text(value: Any) -> str:
    """The canonical JSON text of a JSON-ready value (what the documents' encoder writes)."""
    return _dumps(cast(dict[str, Any], value))
