"""An immutable, hashable mapping and deep-freezing of JSON-like values.

Messages, requests and configs are frozen and hashable, so the mappings they carry
(metadata, tool-call arguments, settings) must be too. ``MappingProxyType`` is read-only
but neither hashable nor safe against the caller keeping the original dict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar, overload

__all__ = [
    "FrozenDict",
    "freeze",
    "thaw",
    "frozen_mapping",
    "EMPTY",
    "clone_with",
    "MAX_NESTING",
    "NestingError",
    "INT_DIGITS",
    "value_fits",
    "text_fits",
]

MAX_NESTING: Final = 100
"""The most levels of objects and arrays a JSON value a thread keeps may nest, counting the
field's own mapping or array (``{"a": [1]}`` nests 2 levels). Metadata, tool-call arguments,
an interrupt's payload and layer state are refused past it where they enter (a message or
call constructor, ``Interrupt``, ``Suspend``, the encoder), and a stored document past it is
a ``CodecError`` when read: the writer and both readers (Python and C) hold the same limit,
so nothing stored is too deep to read back, on any stack."""


INT_DIGITS: Final = 4300
"""The most decimal digits an integer a thread keeps may have: what Python converts to and
from text by default (``sys.get_int_max_str_digits()``), so every reader can read it."""

HUGE_INT: Final = (
    f"is an integer of more than {INT_DIGITS} digits (more than Python reads back from JSON)"
)


_SPLIT_PAIR: Final = re.compile("[\ud800-\udbff][\udc00-\udfff]")

SPLIT_PAIR: Final = (
    "holds a surrogate pair written as two code points, which JSON reads back as the one "
    "character it stands for (join it first: tinyctx.messages.valid_text)"
)


def text_fits(text: str) -> bool:
    """Whether the string ``text`` reads back from JSON as itself: every string does but one
    holding a surrogate pair as two code points (``"\\ud83d\\ude00"``), whose escapes any JSON
    reader joins into one character. A lone surrogate reads back as itself."""
    return text.isascii() or _SPLIT_PAIR.search(text) is None


def value_fits(value: int) -> bool:
    """Whether the integer ``value`` has at most :data:`INT_DIGITS` decimal digits."""
    if value.bit_length() <= 14_000:  # at most 4215 digits: no need to count them
        return True
    try:
        return len(str(abs(value))) <= INT_DIGITS
    except ValueError:  # more digits than this Python converts
        return False


class NestingError(ValueError):
    """A value nested deeper than :data:`MAX_NESTING` levels (the owner's field named)."""


K = TypeVar("K")
_T = TypeVar("_T")
V = TypeVar("V")
_D = TypeVar("_D")


class FrozenDict(Mapping[K, V]):
    """A read-only dict that is hashable when its values are."""

    __slots__ = ("_data", "_hash", "_json_chars")

    _data: dict[K, V]
    _hash: int | None
    # the length of the JSON text, four-space runs counted as 2 characters, if ASCII (else -1):
    # what token counting measures of tool-call arguments (tinyctx.tokens), kept once known
    _json_chars: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_data", dict(*args, **kwargs))
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_json_chars", None)

    @classmethod
    def _wrap(cls, data: dict[K, V]) -> FrozenDict[K, V]:
        """Adopt ``data`` without copying; the caller gives up its reference. (Through the
        slots' own setters: decoding a long thread wraps thousands of mappings.)"""
        new: FrozenDict[K, V] = object.__new__(cls)
        _SET_DATA(new, data)
        _SET_HASH(new, None)
        SET_JSON_CHARS(new, None)
        return new

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | _D, /) -> V | _D: ...
    def get(self, key: K, default: object = None, /) -> object:
        return self._data.get(key, default)

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash(frozenset(self._data.items()))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __or__(self, other: Mapping[K, V]) -> FrozenDict[K, V]:
        merged = dict(self._data)
        # another FrozenDict's own dict: dict.update reads a Mapping key by key in Python
        merged.update(other._data if type(other) is FrozenDict else other)
        return FrozenDict._wrap(merged)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (self._data,))

    def __copy__(self) -> FrozenDict[K, V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict[K, V]:
        return self

    def to_dict(self) -> dict[K, V]:
        """A shallow, mutable copy."""
        return dict(self._data)


# the slots' own setters (FrozenDict refuses attribute assignment): what _wrap fills a new
# mapping with, and how tinyctx.tokens remembers a measured JSON size
_SET_DATA: Callable[[FrozenDict[Any, Any], dict[Any, Any]], None] = FrozenDict.__dict__[
    "_data"
].__set__
_SET_HASH: Callable[[FrozenDict[Any, Any], int | None], None] = FrozenDict.__dict__["_hash"].__set__
SET_JSON_CHARS: Callable[[FrozenDict[Any, Any], int | None], None] = FrozenDict.__dict__[
    "_json_chars"
].__set__


EMPTY: FrozenDict[Any, Any] = FrozenDict()


def freeze(value: Any, _depth: int = 0) -> Any:
    """Deep-freeze a JSON-like value: dicts become FrozenDicts, lists and sets tuples.

    A value whose mappings and sequences nest deeper than :data:`MAX_NESTING` levels is a
    :class:`NestingError` (what no thread could keep; also what no stack could walk)."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None or t is FrozenDict:
        return value
    if isinstance(value, Mapping):
        if _depth >= MAX_NESTING:
            raise _too_deep()
        depth = _depth + 1
        return FrozenDict._wrap({k: freeze(v, depth) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        if _depth >= MAX_NESTING:
            raise _too_deep()
        depth = _depth + 1
        return tuple([freeze(v, depth) for v in value])
    if isinstance(value, (set, frozenset)):
        if _depth >= MAX_NESTING:
            raise _too_deep()
        depth = _depth + 1
        return tuple([freeze(v, depth) for v in sorted(value, key=repr)])
    return value


def _too_deep() -> NestingError:
    return NestingError(
        f"nested deeper than {MAX_NESTING} levels of objects and arrays "
        f"(the most a thread keeps: tinyctx.codec.MAX_NESTING)"
    )


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze`: plain dicts and lists, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def frozen_mapping(value: Mapping[str, Any] | None) -> FrozenDict[str, Any]:
    """attrs converter: any mapping (or None) to a deep-frozen FrozenDict."""
    if value is None:
        return EMPTY
    if type(value) is FrozenDict:
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__}")
    if not value:
        return EMPTY
    frozen: FrozenDict[str, Any] = freeze(value)
    return frozen


_LAYOUT: dict[type, tuple[bool, frozenset[str], tuple[str, ...]]] = {}


def _layout(cls: type) -> tuple[bool, frozenset[str], tuple[str, ...]]:
    """(instances have a __dict__, the fields stored in slots, every field name)."""
    layout = _LAYOUT.get(cls)
    if layout is None:
        import attrs

        slots: set[str] = set()
        for klass in cls.__mro__:
            declared = vars(klass).get("__slots__", ())
            slots.update((declared,) if isinstance(declared, str) else declared)
        fields = tuple(a.name for a in attrs.fields(cls))
        has_dict = any("__dict__" in vars(k) for k in cls.__mro__[:-1])
        layout = _LAYOUT[cls] = (has_dict, frozenset(f for f in fields if f in slots), fields)
    return layout


def clone_with(instance: _T, changes: Mapping[str, Any]) -> _T:
    """A copy of a frozen attrs ``instance`` with ``changes``, running no converter or validator.

    For kernel hot paths (``derive``, event stamping) where every changed value is already
    valid by construction. Fields kept in the instance ``__dict__`` (a ``slots=False`` class,
    or the inherited fields of a slotted subclass of one) are copied with one C-level dict
    copy or update; slotted fields one by one. Not for classes with ``cache_hash=True`` (their
    hidden cache slot is not copied).
    """
    cls = type(instance)
    has_dict, slotted, fields = _LAYOUT.get(cls) or _layout(cls)
    new = object.__new__(cls)
    setter = object.__setattr__
    if has_dict:
        if not slotted:  # every field in the dict (RunConfig, RunContext): a C-level copy
            state = instance.__dict__.copy()
            state.update(changes)
            setter(new, "__dict__", state)
            return new
        state = new.__dict__
        state.update(instance.__dict__)
        for name, value in changes.items():
            if name in slotted:
                setter(new, name, value)
            else:
                state[name] = value
        for name in slotted:
            if name not in changes:
                setter(new, name, getattr(instance, name))
        return new
    cloner = _SLOT_CLONERS.get(cls)
    if cloner is None:
        cloner = _SLOT_CLONERS[cls] = _slot_cloner(cls, fields)
    cloner(instance, new, changes)
    return new


_SLOT_CLONERS: dict[type, Callable[[Any, Any, Mapping[str, Any]], None]] = {}


def _slot_cloner(
    cls: type, fields: tuple[str, ...]
) -> Callable[[Any, Any, Mapping[str, Any]], None]:
    """The copy of a fully slotted class's fields, one line per field (as attrs writes its
    ``__init__``): about a third cheaper than a loop of ``getattr`` over the names, and
    this runs once per model request and stamped event."""
    lines = [
        f"    set(new, {name!r}, changes[{name!r}] if {name!r} in changes else old.{name})"
        for name in fields
    ]
    source = "def copy_fields(old, new, changes):\n" + ("\n".join(lines) or "    pass") + "\n"
    namespace: dict[str, Any] = {"set": object.__setattr__}
    exec(compile(source, f"<tinyctx clone_with {cls.__qualname__}>", "exec"), namespace)
    cloner: Callable[[Any, Any, Mapping[str, Any]], None] = namespace["copy_fields"]
    return cloner
