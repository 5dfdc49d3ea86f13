"""What every format converter shares: the error, the ``tinyctx`` extension, tool arguments,
field overrides kept in metadata, and the pairing check on what was read.

Each converter turns one *unit* (a message, or for Anthropic tool results a content block)
into a tinyctx message and back. Writing a message first *generates* the unit from the
message's own fields. Reading a unit parses it, generates the unit again from what was
parsed, and keeps every field that differs from the generated one (a field tinyctx does not
model, like mini-swe-agent's ``extra``, or another spelling of a modeled one, like a content
part list) in ``metadata[<format>]``. Writing puts those fields back, so a foreign file reads
and writes back without loss, and ``from_x(to_x(m)) == m``. A kept spelling of a modeled
field is only written back while it still says what the message says: a layer that edits
the message's content makes the old spelling stale, and then the generated field is written.

What no native field can carry (``essential``, the rest of ``metadata``, a tool result's
``is_error`` or ``name`` where the format has none) goes into one extra key, ``"tinyctx"``,
in file mode. ``for_api=True`` leaves all of that out: it is what a provider accepts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from ..errors import PairingError, TinyCtxError, a_type
from ..frozen import (
    EMPTY,
    MAX_NESTING,
    FrozenDict,
    freeze,
    frozen_mapping,
    text_fits,
    thaw,
    value_fits,
)
from ..messages import (
    RENAMED_IDS,
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    call_ids,
    check_pairing,
    with_renamed_ids,
)

__all__ = [
    "EXTENSION_KEY",
    "FormatError",
    "Extension",
    "MISSING",
    "read_extension",
    "write_extension",
    "arguments_json",
    "parse_arguments",
    "check_call_expressible",
    "emit_unit",
    "read_overrides",
    "finish_metadata",
    "finish_unit",
    "CallNames",
    "check_read_pairing",
    "expect_mapping",
    "expect_str",
    "core",
    "RENAMED_IDS",
    "unique_call_ids",
    "restore_call_ids",
]

EXTENSION_KEY: Final = "tinyctx"
"""The key, in file mode, that carries what a format has no native field for."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final[Any] = _Missing()


class FormatError(TinyCtxError, ValueError):
    """Input a format cannot read, or a message a format cannot express.

    ``index`` is the position of the message in the sequence being converted (the input
    list when reading, the tinyctx messages when writing); ``line`` is the 1-based line of
    a JSONL file and ``path`` the file, when a loader read one.
    """

    def __init__(
        self,
        message: str,
        *,
        format: str,
        index: int | None = None,
        line: int | None = None,
        path: str | None = None,
    ) -> None:
        self.format = format
        self.index = index
        self.line = line
        self.path = path
        self.reason = message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        elif line is not None:
            where = f"line {line}: "
        at = f" message {index}" if index is not None else ""
        super().__init__(f"{where}{format}{at}: {message}")

    def located(self, *, path: str | None = None, line: int | None = None) -> FormatError:
        """The same error with a file location added."""
        return FormatError(
            self.reason,
            format=self.format,
            index=self.index,
            line=line if line is not None else self.line,
            path=path if path is not None else self.path,
        )


# ---------------------------------------------------------------------------------------
# small readers


def expect_mapping(value: object, what: str, *, fmt: str, index: int | None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FormatError(
            f"{what} must be a JSON object, got {type(value).__name__}", format=fmt, index=index
        )
    return value


def expect_str(value: object, what: str, *, fmt: str, index: int | None) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(
            f"{what} must be a non-empty string, got {value!r}", format=fmt, index=index
        )
    return value


def core(message: Message) -> Message:
    """``message`` without its metadata and essential flag: what a unit's fields say."""
    if message.metadata or not message.essential:
        return attrs.evolve(message, metadata=EMPTY, essential=True)
    return message


# ---------------------------------------------------------------------------------------
# the tinyctx extension


@attrs.frozen
class Extension:
    """The parsed ``"tinyctx"`` key of one unit."""

    essential: bool = True
    metadata: Mapping[str, Any] = EMPTY
    name: str | None = None
    is_error: bool | None = None
    invalid_arguments: Mapping[str, str] = EMPTY


_EXTENSION_FIELDS = {
    "essential": bool,
    "metadata": Mapping,
    "name": str,
    "is_error": bool,
    "invalid_arguments": Mapping,
}


def read_extension(
    raw: Mapping[str, Any], *, allowed: Iterable[str], fmt: str, index: int | None
) -> Extension:
    """Parse ``raw["tinyctx"]`` (absent: the defaults); unknown keys are an error."""
    value = raw.get(EXTENSION_KEY)
    if value is None:
        return Extension()
    ext = expect_mapping(value, f"the {EXTENSION_KEY!r} key", fmt=fmt, index=index)
    allowed_set = set(allowed)
    fields: dict[str, Any] = {}
    for key, item in ext.items():
        kind = _EXTENSION_FIELDS.get(key)
        if key not in allowed_set or kind is None:
            raise FormatError(
                f"unknown key {key!r} in {EXTENSION_KEY!r} (allowed here: "
                f"{', '.join(sorted(allowed_set))})",
                format=fmt,
                index=index,
            )
        if not isinstance(item, kind):
            raise FormatError(
                f"{EXTENSION_KEY}.{key} must be {kind.__name__}, got {item!r}",
                format=fmt,
                index=index,
            )
        fields[key] = item
    invalid = fields.get("invalid_arguments", {})
    for call_id, text in invalid.items():
        if not isinstance(text, str):
            raise FormatError(
                f"{EXTENSION_KEY}.invalid_arguments[{call_id!r}] must be a string",
                format=fmt,
                index=index,
            )
    return Extension(**fields)


def write_extension(
    unit: dict[str, Any],
    message: Message,
    metadata: Mapping[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """Add the ``"tinyctx"`` key to ``unit`` when anything needs it (file mode)."""
    ext: dict[str, Any] = {}
    if not message.essential:
        ext["essential"] = False
    if metadata:
        ext["metadata"] = thaw(metadata)
    for key, value in extra.items():
        if value is not None and value != {}:
            ext[key] = value
    if ext:
        unit[EXTENSION_KEY] = ext
    return unit


# ---------------------------------------------------------------------------------------
# tool call arguments


def parse_arguments(raw: object) -> tuple[Mapping[str, Any], str | None]:
    """``(arguments, invalid_arguments)`` from a JSON string the model produced.

    An empty string means no arguments; a string that is not a JSON object is kept verbatim
    as ``invalid_arguments`` (the loop reports it to the model); an object is taken as is,
    unless a thread could not keep it (see :func:`keepable`: nested past
    :data:`~tinyctx.codec.MAX_NESTING` levels, ``NaN``, an integer past 4300 digits): that
    is invalid arguments too, so the call gets an error result and the run goes on.
    """
    if isinstance(raw, Mapping):
        if not keepable(raw):
            return {}, _deep_text(raw)
        return raw, None
    if not isinstance(raw, str):
        return {}, _deep_text(raw)
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or an integer past 4300 digits
        return {}, raw
    if isinstance(value, dict) and keepable(value):
        return value, None
    return {}, raw


def keepable(value: object) -> bool:
    """Whether ``value`` is JSON a thread keeps: str keys, finite floats (``NaN`` and
    ``1e400`` parse to floats that are not), integers of at most 4300 digits, strings that
    read back as themselves (:func:`tinyctx.frozen.text_fits`), nested at most
    :data:`~tinyctx.codec.MAX_NESTING` levels. Walked without recursion."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not text_fits(item):
                return False
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not value_fits(item):
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, Mapping):
            if depth >= MAX_NESTING or not all(
                isinstance(key, str) and text_fits(key) for key in item
            ):
                return False
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)):
            if depth >= MAX_NESTING:
                return False
            stack.extend((child, depth + 1) for child in item)
        else:
            return False
    return True


def _deep_text(raw: object) -> str:
    """The JSON text of arguments that are not a JSON object a call can hold (nested past
    :data:`~tinyctx.codec.MAX_NESTING`, or not an object)."""
    try:
        return json.dumps(raw, ensure_ascii=False, default=str)
    except RecursionError:
        return f"<{a_type(type(raw))} nested deeper than {MAX_NESTING} levels>"
    except ValueError as exc:  # a cycle
        return f"<{a_type(type(raw))} that is not JSON: {exc}>"


def arguments_json(call: ToolCall, *, fmt: str, index: int) -> str:
    """The JSON text of ``call``'s arguments (its raw text when it was not JSON)."""
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    try:
        return json.dumps(thaw(call.arguments), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise FormatError(
            f"tool call {call.id!r}: arguments are not JSON ({exc})", format=fmt, index=index
        ) from exc


def check_call_expressible(call: ToolCall, *, fmt: str, index: int) -> None:
    """A call whose ``invalid_arguments`` would read back differently is an error."""
    if call.invalid_arguments is None:
        return
    if call.arguments:
        raise FormatError(
            f"tool call {call.id!r} has both arguments and invalid_arguments; a format stores "
            "one argument text per call",
            format=fmt,
            index=index,
        )
    _, invalid = parse_arguments(call.invalid_arguments)
    if invalid is None:
        raise FormatError(
            f"tool call {call.id!r}: invalid_arguments {call.invalid_arguments!r} is empty or "
            "a valid JSON object, so it would read back as arguments",
            format=fmt,
            index=index,
        )


# ---------------------------------------------------------------------------------------
# overrides: fields of a unit that differ from what tinyctx generates


def emit_unit(
    message: Message,
    generated: dict[str, Any],
    namespace: str,
    *,
    modeled: frozenset[str],
    reads_back: Callable[[dict[str, Any]], bool],
    for_api: bool,
    api_fields: frozenset[str] = frozenset(),
    api_filter: Callable[[str, Any], Any] | None = None,
) -> tuple[dict[str, Any], FrozenDict[str, Any]]:
    """The unit to write for ``message`` and the metadata the extension must still carry.

    ``metadata[namespace]`` holds fields kept from a read file. They are written back when
    all of them can be: each differs from the generated field, and when one replaces a
    modeled field the unit still ``reads_back`` to the same message. Otherwise none is
    written and the extension carries the whole metadata, so nothing is lost either way.
    ``for_api`` writes back only ``api_fields`` (through ``api_filter``) that still read
    back to the message; the metadata returned then does not matter.
    """
    metadata = message.metadata
    kept = metadata.get(namespace, None)
    if not (
        isinstance(kept, Mapping)
        and kept
        and all(isinstance(k, str) and k != EXTENSION_KEY for k in kept)
    ):
        return generated, metadata
    if for_api:
        # only the API's own fields matter, and only while they still say what the message says
        api_unit = dict(generated)
        for key, value in kept.items():
            if key in api_fields:
                plain = thaw(value)
                api_unit[key] = api_filter(key, plain) if api_filter is not None else plain
        if len(api_unit) == len(generated) and api_unit == generated:
            return generated, metadata
        return (api_unit if reads_back(api_unit) else generated), metadata
    unit = dict(generated)
    for key, value in kept.items():
        plain = thaw(value)
        if generated.get(key, MISSING) == plain:
            return generated, metadata
        unit[key] = plain
    if any(key in modeled for key in kept) and not reads_back(unit):
        return generated, metadata
    rest: FrozenDict[str, Any] = FrozenDict({k: v for k, v in metadata.items() if k != namespace})
    return unit, rest


def read_overrides(raw: Mapping[str, Any], generated: Mapping[str, Any]) -> dict[str, Any]:
    """Fields of ``raw`` that differ from the unit tinyctx would generate."""
    return {
        key: value
        for key, value in raw.items()
        if key != EXTENSION_KEY and generated.get(key, MISSING) != value
    }


def finish_metadata(
    ext: Extension, namespace: str, overrides: Mapping[str, Any], *, fmt: str, index: int | None
) -> FrozenDict[str, Any]:
    """The metadata of a read message: the extension's plus the kept fields."""
    if not overrides:
        return frozen_mapping(ext.metadata)
    if namespace in ext.metadata:
        raise FormatError(
            f"{EXTENSION_KEY}.metadata has a {namespace!r} key and the unit has fields "
            f"tinyctx keeps there too ({', '.join(sorted(overrides))})",
            format=fmt,
            index=index,
        )
    merged = dict(ext.metadata)
    merged[namespace] = overrides
    frozen: FrozenDict[str, Any] = freeze(merged)
    return frozen


def finish_unit(
    parsed: Message,
    unit: Mapping[str, Any],
    generated: Mapping[str, Any],
    ext: Extension,
    namespace: str,
    calls: CallNames,
    *,
    fmt: str,
    index: int | None,
) -> Message:
    """The read message: what ``unit`` says (``parsed``), its kept fields and extension."""
    metadata = finish_metadata(
        ext, namespace, read_overrides(unit, generated), fmt=fmt, index=index
    )
    changes: dict[str, Any] = {}
    if metadata:
        changes["metadata"] = metadata
    if not ext.essential:
        changes["essential"] = False
    if ext.is_error and isinstance(parsed, ToolResult):
        changes["is_error"] = True
    message = attrs.evolve(parsed, **changes) if changes else parsed
    calls.add(message)
    return message


# ---------------------------------------------------------------------------------------
# reading: tool call names and the pairing check


class CallNames:
    """Tool call id -> name of every call read so far; answers whose result this is."""

    __slots__ = ("_names",)

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def add(self, message: Message) -> None:
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                self._names[call.id] = call.name

    def name_of(self, call_id: str, *, fmt: str, index: int | None) -> str:
        name = self._names.get(call_id)
        if name is None:
            raise FormatError(
                f"tool result without a call: tool_call_id {call_id!r} answers no earlier "
                "tool call",
                format=fmt,
                index=index,
            )
        return name

    def get(self, call_id: str) -> str | None:
        return self._names.get(call_id)


def check_read_pairing(messages: Sequence[Message], origins: Sequence[int], *, fmt: str) -> None:
    """Pairing of what was read (pending calls at the end are allowed), as a FormatError
    naming the input index."""
    try:
        check_pairing(messages)
    except PairingError as exc:
        raise FormatError(str(exc), format=fmt, index=origins[exc.index]) from exc


# ---------------------------------------------------------------------------------------
# reused tool call ids


def unique_call_ids(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with a call id that an earlier call already used renamed (``<id>_r<n>``),
    along with the results that answer it (a result answers the latest call of its id).

    Some agents and servers reuse ids ("call_0" every turn); tinyctx needs each call and its
    result to be one unit, so ids must be unique in a history. The file's id is kept in
    ``metadata["tinyctx"]["renamed_ids"]`` and the writers put it back.
    """
    used = call_ids(messages)
    seen: set[str] = set()
    latest: dict[str, str] = {}
    counts: dict[str, int] = {}
    out: list[Message] = []
    for message in messages:
        if isinstance(message, AssistantMessage) and message.tool_calls:
            mapping: dict[str, str] = {}
            for call in message.tool_calls:
                if call.id in seen:
                    count = counts.get(call.id, 1)
                    new_id = f"{call.id}_r{count + 1}"
                    while new_id in used:
                        count += 1
                        new_id = f"{call.id}_r{count + 1}"
                    counts[call.id] = count + 1
                    used.add(new_id)
                    mapping[new_id] = call.id
                    latest[call.id] = new_id
                else:
                    latest[call.id] = call.id
                seen.add(call.id)
            out.append(with_renamed_ids(message, mapping) if mapping else message)
        elif (
            isinstance(message, ToolResult)
            and latest.get(message.tool_call_id, message.tool_call_id) != message.tool_call_id
        ):
            out.append(
                with_renamed_ids(message, {latest[message.tool_call_id]: message.tool_call_id})
            )
        else:
            out.append(message)
    return out


def restore_call_ids(messages: Sequence[Message]) -> Sequence[Message]:
    """The history with the file's reused ids put back, when reading it back renames them
    to exactly these messages again (otherwise ``messages`` as they are)."""
    if not any(RENAMED_IDS in (m.metadata.get("tinyctx", None) or {}) for m in messages):
        return messages
    restored: list[Message] = []
    for message in messages:
        own = message.metadata.get("tinyctx", None)
        mapping = own.get(RENAMED_IDS) if isinstance(own, Mapping) else None
        if not isinstance(mapping, Mapping):
            restored.append(message)
            continue
        rest = {k: v for k, v in own.items() if k != RENAMED_IDS}
        meta = {k: v for k, v in message.metadata.items() if k != "tinyctx"}
        if rest:
            meta["tinyctx"] = rest
        try:
            if isinstance(message, AssistantMessage):
                calls = tuple(
                    attrs.evolve(c, id=mapping.get(c.id, c.id)) for c in message.tool_calls
                )
                restored.append(attrs.evolve(message, tool_calls=calls, metadata=meta))
            elif isinstance(message, ToolResult):
                original = mapping.get(message.tool_call_id, message.tool_call_id)
                restored.append(attrs.evolve(message, tool_call_id=original, metadata=meta))
            else:
                restored.append(message)
        except (TypeError, ValueError):
            return messages
    return restored if unique_call_ids(restored) == list(messages) else messages
