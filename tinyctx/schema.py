"""JSON Schema (draft 2020-12) from Python type hints, and validation against the same types.

One compiled type tree drives both the model-visible schema and the check of the model's
arguments, so the two cannot drift apart: a value is accepted exactly when the schema
accepts it. Accepted values are converted to what the signature asks for (a JSON integer
for a ``float``, an array for a ``tuple``, an object for an attrs class, a dataclass or a
TypedDict, a string for an ``Enum`` member).

Supported: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``Literal``, ``Enum``,
``list`` / ``Sequence``, ``tuple`` (fixed and variadic), ``set`` / ``frozenset`` (unique
items), ``dict`` / ``Mapping`` with ``str`` keys, ``Optional`` / ``Union`` / ``X | Y``,
attrs classes, dataclasses, ``TypedDict`` (``Required`` / ``NotRequired``), ``NewType`` and
``Annotated[T, "description"]``. Classes go to ``$defs`` (recursive classes work). The
``$schema`` keyword is left out: several providers reject it in tool parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NoReturn, get_args, get_origin

import attrs

from .docstrings import Docstring, parse_docstring
from .errors import TinyCtxError
from .frozen import FrozenDict, thaw

try:  # typing_extensions.TypedDict is a different class before Python 3.13
    import typing_extensions as _te

    is_typeddict = _te.is_typeddict  # knows both TypedDict classes
    _te_required: Any = _te.Required
    _te_not_required: Any = _te.NotRequired
except ImportError:  # pragma: no cover - typing_extensions is nearly always installed
    is_typeddict = typing.is_typeddict
    _te_required = typing.Required
    _te_not_required = typing.NotRequired
_REQUIRED_MARKERS = (typing.Required, typing.NotRequired, _te_required, _te_not_required)

__all__ = [
    "ArgumentsSchema",
    "Param",
    "RuntimeMarker",
    "SchemaError",
    "ToolArgumentError",
    "to_json_value",
]

_MISSING: Any = inspect.Parameter.empty


class SchemaError(TinyCtxError, TypeError):
    """A type hint that has no JSON Schema (raised when the tool is defined)."""


class ToolArgumentError(TinyCtxError, ValueError):
    """The model's arguments do not match the tool's signature; ``problems`` says how.

    Each problem names the parameter (or the path inside it), what was expected and what
    was given, so the model can read the error result and call the tool again.
    """

    def __init__(self, tool: str, problems: Sequence[str]) -> None:
        self.tool = tool
        self.problems = tuple(problems)
        super().__init__(f"invalid arguments for tool {tool!r}: " + "; ".join(self.problems))


class RuntimeMarker:
    """Base of ``Annotated`` metadata that marks a value filled at run time, never by the
    model (``tinyctx.Inject``). Only allowed on a whole parameter, never nested."""

    __slots__ = ()


# ---------------------------------------------------------------------------------------
# JSON values


def _json_key(value: Any) -> Any:
    """A hashable key with JSON equality: ``1 == 1.0``, ``true != 1``."""
    if value is None:
        return ("null",)
    if value is True or value is False:
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, Mapping):
        return ("obj", frozenset((k, _json_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("arr", tuple(_json_key(v) for v in value))
    return ("other", id(value))


def _show(value: Any) -> str:
    try:
        text = json.dumps(thaw(value), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def to_json_value(value: Any, fallback: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as plain JSON data: enums by value, attrs classes, dataclasses and mappings
    as objects, sequences and sets as arrays. Anything else goes to ``fallback`` (or
    raises TypeError)."""
    if isinstance(value, enum.Enum):  # before str/int: StrEnum and IntEnum are both
        return to_json_value(value.value, fallback)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    cls = type(value)
    if attrs.has(cls):
        return {
            a.alias: to_json_value(getattr(value, a.name), fallback)
            for a in attrs.fields(cls)
            if a.init
        }
    if dataclasses.is_dataclass(value):
        return {
            f.name: to_json_value(getattr(value, f.name), fallback)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v, fallback) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, fallback) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [to_json_value(v, fallback) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if fallback is not None:
        return fallback(value)
    raise TypeError(f"{cls.__name__} is not JSON data")


# ---------------------------------------------------------------------------------------
# the compiled type tree


class _Invalid(Exception):
    """``shape_ok``: the value had the right JSON type and failed inside (a union reports
    such an error rather than "expected one of ...")."""

    def __init__(self, message: str, *, shape_ok: bool = True) -> None:
        self.message = message
        self.shape_ok = shape_ok
        self.where: list[str] = []  # path segments, innermost first: built only on failure

    def at(self, segment: str) -> _Invalid:
        self.where.append(segment)
        return self

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.where))


def _fail(expected: str, value: Any) -> NoReturn:
    raise _Invalid(f"expected {expected}, got {_show(value)}", shape_ok=False)


class _Defs:
    """Names and schemas of the classes a schema references through ``$defs``."""

    def __init__(self) -> None:
        self.names: dict[_ClassNode, str] = {}
        self.schemas: dict[str, dict[str, Any]] = {}

    def ref(self, node: _ClassNode) -> dict[str, Any]:
        name = self.names.get(node)
        if name is None:
            base = node.cls.__name__
            name, n = base, 1
            while name in self.schemas:
                n += 1
                name = f"{base}{n}"
            self.names[node] = name
            self.schemas[name] = {}  # placeholder: a recursive class refers to itself
            self.schemas[name] = node.definition(self)
        return {"$ref": f"#/$defs/{name}"}


class _Node:
    """A compiled type: its schema, its check-and-convert, and a phrase for errors."""

    __slots__ = ()

    @property
    def nullable(self) -> bool:
        """Whether ``null`` is accepted."""
        return False

    @property
    def hashable(self) -> bool:
        """Whether converted values can be set items."""
        return True

    def schema(self, defs: _Defs) -> dict[str, Any]:
        raise NotImplementedError

    def convert(self, value: Any, strict: bool) -> Any:
        """The value as the signature wants it, or ``_Invalid``. ``strict`` refuses the
        numeric coercions (int <-> float), so a union tries exact matches first."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class _AnyNode(_Node):
    __slots__ = ()

    @property
    def nullable(self) -> bool:
        return True

    @property
    def hashable(self) -> bool:
        return False

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {}

    def convert(self, value: Any, strict: bool) -> Any:
        return thaw(value)

    def describe(self) -> str:
        return "any value"


class _Scalar(_Node):
    __slots__ = ("_check", "_phrase", "_type")

    def __init__(self, json_type: str, phrase: str, check: Callable[[Any], bool]) -> None:
        self._type = json_type
        self._phrase = phrase
        self._check = check

    @property
    def nullable(self) -> bool:
        return self._type == "null"

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {"type": self._type}

    def convert(self, value: Any, strict: bool) -> Any:
        if self._check(value):
            return value
        _fail(self._phrase, value)

    def describe(self) -> str:
        return self._phrase


class _StrNode(_Node):
    __slots__ = ()

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {"type": "string"}

    def convert(self, value: Any, strict: bool) -> Any:
        if isinstance(value, str):
            return value
        _fail("a string", value)

    def describe(self) -> str:
        return "a string"


class _IntNode(_Node):
    __slots__ = ()

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {"type": "integer"}

    def convert(self, value: Any, strict: bool) -> Any:
        t = type(value)
        if t is int or (isinstance(value, int) and t is not bool):
            return value
        if not strict and isinstance(value, float) and value.is_integer():
            return int(value)
        _fail("an integer", value)

    def describe(self) -> str:
        return "an integer"


class _FloatNode(_Node):
    __slots__ = ()

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {"type": "number"}

    def convert(self, value: Any, strict: bool) -> Any:
        if isinstance(value, float):
            return value
        if not strict and isinstance(value, int) and type(value) is not bool:
            try:
                return float(value)
            except OverflowError:
                return value  # too large for a float: an int still behaves as a number
        _fail("a number", value)

    def describe(self) -> str:
        return "a number"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


class _ChoiceNode(_Node):
    """``Literal[...]`` and ``Enum``: a fixed set of JSON scalars, each mapped to its value."""

    __slots__ = ("_by_key", "_description", "_json", "_phrase", "_title")

    def __init__(
        self,
        choices: Sequence[tuple[Any, Any]],
        title: str | None = None,
        description: str | None = None,
    ) -> None:
        self._json = [j for j, _ in choices]
        self._by_key = {_json_key(j): python for j, python in choices}
        self._phrase = "one of " + ", ".join(_show(j) for j in self._json)
        self._title = title
        self._description = description

    @property
    def nullable(self) -> bool:
        return ("null",) in self._by_key

    def schema(self, defs: _Defs) -> dict[str, Any]:
        out: dict[str, Any] = {}
        kinds = {_json_type(j) for j in self._json}
        if len(kinds) == 1:
            out["type"] = kinds.pop()
        out["enum"] = list(self._json)
        if self._title:
            out["title"] = self._title
        if self._description:
            out["description"] = self._description
        return out

    def convert(self, value: Any, strict: bool) -> Any:
        key = _json_key(value)
        if key in self._by_key:
            return self._by_key[key]
        _fail(self._phrase, value)

    def describe(self) -> str:
        return self._phrase


class _Described(_Node):
    __slots__ = ("_description", "_inner")

    def __init__(self, inner: _Node, description: str) -> None:
        self._inner = inner
        self._description = description

    @property
    def nullable(self) -> bool:
        return self._inner.nullable

    @property
    def hashable(self) -> bool:
        return self._inner.hashable

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return {**self._inner.schema(defs), "description": self._description}

    def convert(self, value: Any, strict: bool) -> Any:
        return self._inner.convert(value, strict)

    def describe(self) -> str:
        return self._inner.describe()


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _is_object(value: Any) -> bool:
    t = type(value)  # the common cases first: an ABC isinstance check is slow
    return t is FrozenDict or t is dict or isinstance(value, Mapping)


class _ArrayNode(_Node):
    __slots__ = ("_container", "_item", "_unique")

    def __init__(self, item: _Node, container: Callable[[list[Any]], Any], unique: bool) -> None:
        self._item = item
        self._container = container
        self._unique = unique

    @property
    def hashable(self) -> bool:
        return self._container is tuple and self._item.hashable

    def schema(self, defs: _Defs) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        items = self._item.schema(defs)
        if items:
            out["items"] = items
        if self._unique:
            out["uniqueItems"] = True
        return out

    def convert(self, value: Any, strict: bool) -> Any:
        if not _is_array(value):
            _fail(self.describe(), value)
        if self._unique:
            seen: set[Any] = set()
            for index, item in enumerate(value):
                key = _json_key(item)
                if key in seen:
                    raise _Invalid(f"duplicate item {_show(item)}").at(f"[{index}]")
                seen.add(key)
        convert = self._item.convert
        out = []
        for index, item in enumerate(value):
            try:
                out.append(convert(item, strict))
            except _Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return self._container(out)

    def describe(self) -> str:
        what = "an array of unique items" if self._unique else "an array"
        inner = self._item.describe()
        return what if inner == "any value" else f"{what} ({inner} each)"


class _TupleNode(_Node):
    __slots__ = ("_items",)

    def __init__(self, items: Sequence[_Node]) -> None:
        self._items = tuple(items)

    @property
    def hashable(self) -> bool:
        return all(i.hashable for i in self._items)

    def schema(self, defs: _Defs) -> dict[str, Any]:
        n = len(self._items)
        return {
            "type": "array",
            "prefixItems": [i.schema(defs) for i in self._items],
            "items": False,
            "minItems": n,
            "maxItems": n,
        }

    def convert(self, value: Any, strict: bool) -> Any:
        if not _is_array(value) or len(value) != len(self._items):
            _fail(self.describe(), value)
        out = []
        for index, (node, item) in enumerate(zip(self._items, value, strict=True)):
            try:
                out.append(node.convert(item, strict))
            except _Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return tuple(out)

    def describe(self) -> str:
        n = len(self._items)
        kinds = ", ".join(i.describe() for i in self._items)
        return f"an array of exactly {n} items [{kinds}]"


class _DictNode(_Node):
    __slots__ = ("_value",)

    @property
    def hashable(self) -> bool:
        return False

    def __init__(self, value: _Node) -> None:
        self._value = value

    def schema(self, defs: _Defs) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        values = self._value.schema(defs)
        if values:
            out["additionalProperties"] = values
        return out

    def convert(self, value: Any, strict: bool) -> Any:
        if not _is_object(value) or not all(isinstance(k, str) for k in value):
            _fail(self.describe(), value)
        convert = self._value.convert
        out = {}
        for key, item in value.items():
            try:
                out[key] = convert(item, strict)
            except _Invalid as exc:
                raise exc.at(f".{key}") from None
        return out

    def describe(self) -> str:
        inner = self._value.describe()
        return "an object" if inner == "any value" else f"an object ({inner} per key)"


class _UnionNode(_Node):
    __slots__ = ("_options",)

    def __init__(self, options: Sequence[_Node]) -> None:
        self._options = tuple(options)

    @property
    def nullable(self) -> bool:
        return any(o.nullable for o in self._options)

    @property
    def hashable(self) -> bool:
        return all(o.hashable for o in self._options)

    def schema(self, defs: _Defs) -> dict[str, Any]:
        schemas = [o.schema(defs) for o in self._options]
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            return {"type": list(dict.fromkeys(s["type"] for s in schemas))}
        return {"anyOf": schemas}

    def convert(self, value: Any, strict: bool) -> Any:
        closest: _Invalid | None = None
        passes = (True,) if strict else (True, False)
        for pass_strict in passes:
            closest = None  # report what the most lenient pass found
            for option in self._options:
                try:
                    return option.convert(value, pass_strict)
                except _Invalid as exc:
                    if (exc.shape_ok or exc.where) and (
                        closest is None or len(exc.where) > len(closest.where)
                    ):
                        closest = exc
        if closest is not None:
            raise closest  # the option whose shape matched says what is wrong inside
        _fail(self.describe(), value)

    def describe(self) -> str:
        return "one of: " + "; ".join(o.describe() for o in self._options)


@attrs.frozen
class _Field:
    name: str  # the JSON property name (attrs: the init alias)
    node: _Node
    required: bool
    default: Any = _MISSING
    description: str | None = None


class _ClassNode(_Node):
    """attrs classes, dataclasses and TypedDicts: an object with known properties."""

    __slots__ = ("cls", "description", "fields", "kind")

    def __init__(self, cls: type, kind: Literal["attrs", "dataclass", "typeddict"]) -> None:
        self.cls = cls
        self.kind = kind
        self.fields: tuple[_Field, ...] = ()
        self.description: str | None = None

    @property
    def hashable(self) -> bool:
        return self.kind != "typeddict" and getattr(self.cls, "__hash__", None) is not None

    def definition(self, defs: _Defs) -> dict[str, Any]:
        properties = {
            f.name: _property_schema(f.node, f.default, f.description, defs) for f in self.fields
        }
        out: dict[str, Any] = {"type": "object", "title": self.cls.__name__}
        if self.description:
            out["description"] = self.description
        out["properties"] = properties
        required = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        out["additionalProperties"] = False
        return out

    def schema(self, defs: _Defs) -> dict[str, Any]:
        return defs.ref(self)

    def convert(self, value: Any, strict: bool) -> Any:
        if not _is_object(value):
            _fail(self.describe(), value)
        out: dict[str, Any] = {}
        for f in self.fields:
            name = f.name
            if name in value:
                try:
                    out[name] = f.node.convert(value[name], strict)
                except _Invalid as exc:
                    raise exc.at(f".{name}") from None
            elif f.required:
                raise _Invalid(f"missing required property {name!r} ({f.node.describe()})")
        if len(out) != len(value):
            known = {f.name for f in self.fields}
            unexpected = next(key for key in value if key not in known)
            allowed = ", ".join(sorted(known)) or "none"
            raise _Invalid(f"unexpected property {unexpected!r} (allowed: {allowed})")
        if self.kind == "typeddict":
            return out
        try:
            return self.cls(**out)
        except Exception as exc:  # the class's own validators: report, do not crash
            raise _Invalid(f"{self.cls.__name__} rejected the value: {exc}") from None

    def describe(self) -> str:
        return f"an object {self.cls.__name__} with properties " + (
            ", ".join(f.name + ("" if f.required else "?") for f in self.fields) or "none"
        )


def _property_schema(
    node: _Node, default: Any, description: str | None, defs: _Defs
) -> dict[str, Any]:
    out = node.schema(defs)
    # Annotated[T, "..."] wins over the docstring, which wins over the type's own doc
    if description and not isinstance(node, _Described):
        out = {**out, "description": description}
    if default is not _MISSING:
        # a default that is not JSON stays unseen by the model, and still applies
        with contextlib.suppress(TypeError):
            out = {**out, "default": to_json_value(default)}
    return out


_STR = _StrNode()
_BOOL = _Scalar("boolean", "a boolean (true or false)", lambda v: v is True or v is False)
_NULL = _Scalar("null", "null", lambda v: v is None)
_ANY = _AnyNode()
_INT = _IntNode()
_FLOAT = _FloatNode()

_LIST_ORIGINS: tuple[Any, ...] = (list, Sequence, typing.MutableSequence, Iterable)
_SET_ORIGINS: tuple[Any, ...] = (set, frozenset, typing.AbstractSet, typing.MutableSet)
_DICT_ORIGINS: tuple[Any, ...] = (dict, Mapping, typing.MutableMapping)


def _metadata_text(meta: object) -> str | None:
    if isinstance(meta, str):
        return meta
    doc = getattr(meta, "documentation", None)  # PEP 727 ``Doc("...")``
    return doc if isinstance(doc, str) else None


def _own_doc(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or not doc.strip():
        return None
    if dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
        return None  # the signature dataclasses writes when there is no docstring
    if doc == "An enumeration.":
        return None
    return doc


class _Compiler:
    def __init__(self) -> None:
        self._classes: dict[type, _ClassNode] = {}

    def compile(self, tp: Any) -> _Node:
        if tp is Any or tp is object:
            return _ANY
        if tp is None or tp is type(None):
            return _NULL
        supertype = getattr(tp, "__supertype__", None)
        if supertype is not None:  # NewType
            return self.compile(supertype)
        origin, args = get_origin(tp), get_args(tp)
        if origin is typing.Annotated:
            return self._annotated(args[0], args[1:])
        if origin is typing.Union or origin is types.UnionType:
            return self._union(args)
        if origin is Literal:
            return _ChoiceNode(self._literal_choices(args))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self._enum(tp)
        if tp is str:
            return _STR
        if tp is bool:
            return _BOOL
        if tp is int:
            return _INT
        if tp is float:
            return _FLOAT
        if tp in _LIST_ORIGINS or origin in _LIST_ORIGINS:
            return _ArrayNode(self.compile(args[0]) if args else _ANY, list, unique=False)
        if tp is tuple or tp is typing.Tuple:  # noqa: UP006
            return _ArrayNode(_ANY, tuple, unique=False)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return _ArrayNode(self.compile(args[0]), tuple, unique=False)
            return _TupleNode([self.compile(a) for a in args])
        if tp in _SET_ORIGINS or origin in _SET_ORIGINS:
            item = self.compile(args[0]) if args else _ANY
            if not item.hashable:
                what = repr(args[0]) if args else "any value"
                raise SchemaError(f"set items must be hashable, {what} is not (say set[str])")
            container = frozenset if (origin or tp) is frozenset else set
            return _ArrayNode(item, container, unique=True)
        if tp in _DICT_ORIGINS or origin in _DICT_ORIGINS:
            if args and args[0] not in (str, Any):
                raise SchemaError(f"object keys are strings: {tp!r} needs str keys")
            return _DictNode(self.compile(args[1]) if args else _ANY)
        if origin in _REQUIRED_MARKERS:
            raise SchemaError(f"{tp!r} is only meaningful inside a TypedDict")
        if isinstance(tp, type):
            if is_typeddict(tp):
                return self._class(tp, "typeddict")
            if attrs.has(tp):
                return self._class(tp, "attrs")
            if dataclasses.is_dataclass(tp):
                return self._class(tp, "dataclass")
        if isinstance(tp, (str, typing.ForwardRef)):
            raise SchemaError(f"unresolved forward reference {tp!r}")
        raise SchemaError(f"no JSON Schema for {tp!r}")

    def _annotated(self, inner: Any, metadata: Sequence[Any]) -> _Node:
        for meta in metadata:
            if isinstance(meta, RuntimeMarker):
                raise SchemaError(
                    f"{meta!r} marks a whole parameter as injected; it cannot be nested "
                    f"inside another type"
                )
        node = self.compile(inner)
        texts = [t for t in map(_metadata_text, metadata) if t]
        return _Described(node, " ".join(texts)) if texts else node

    def _union(self, args: Sequence[Any]) -> _Node:
        options = [self.compile(a) for a in args]
        return options[0] if len(options) == 1 else _UnionNode(options)

    @staticmethod
    def _literal_choices(args: Sequence[Any]) -> list[tuple[Any, Any]]:
        choices = []
        for value in args:
            json_value = value.value if isinstance(value, enum.Enum) else value
            if not (json_value is None or isinstance(json_value, (str, int, float, bool))):
                raise SchemaError(f"Literal value {value!r} is not a JSON scalar")
            choices.append((json_value, value))
        return choices

    def _enum(self, cls: type[enum.Enum]) -> _Node:
        doc = _own_doc(cls)
        description = inspect.cleandoc(doc) if doc else None
        return _ChoiceNode(self._literal_choices(list(cls)), cls.__name__, description)

    def _class(self, cls: type, kind: Literal["attrs", "dataclass", "typeddict"]) -> _Node:
        node = self._classes.get(cls)
        if node is not None:
            return node
        node = self._classes[cls] = _ClassNode(cls, kind)  # registered first: recursion
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception as exc:
            raise SchemaError(f"cannot resolve the type hints of {cls.__name__}: {exc}") from exc
        doc = parse_docstring(_own_doc(cls))
        node.description = doc.description or None
        fields: list[_Field] = []
        if kind == "typeddict":
            required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
            for name, tp in hints.items():
                # explicit markers win: with string annotations (PEP 563) Python 3.11
                # cannot see them when it computes __required_keys__
                required = name in required_keys
                while get_origin(tp) in _REQUIRED_MARKERS:
                    required = get_origin(tp) in (typing.Required, _te_required)
                    tp = get_args(tp)[0]
                fields.append(self._field(cls, name, tp, required, _MISSING, doc))
        elif kind == "attrs":
            for a in attrs.fields(cls):
                if not a.init:
                    continue
                tp = hints.get(a.name, a.type if a.type is not None else Any)
                default = a.default
                required = default is attrs.NOTHING
                if required or isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    default = _MISSING
                text = a.metadata.get("description") if a.metadata else None
                fields.append(self._field(cls, a.alias, tp, required, default, doc, text))
        else:
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                has_default = f.default is not dataclasses.MISSING
                required = not has_default and f.default_factory is dataclasses.MISSING
                default = f.default if has_default else _MISSING
                tp = hints.get(f.name, Any)
                text = f.metadata.get("description") if f.metadata else None
                fields.append(self._field(cls, f.name, tp, required, default, doc, text))
        node.fields = tuple(fields)
        return node

    def _field(
        self,
        cls: type,
        name: str,
        tp: Any,
        required: bool,
        default: Any,
        doc: Docstring,
        text: str | None = None,
    ) -> _Field:
        try:
            node = self.compile(tp)
        except SchemaError as exc:
            raise SchemaError(f"{cls.__name__}.{name}: {exc}") from None
        return _Field(name, node, required, default, text or doc.params.get(name))

    def parameter(self, tp: Any, default: Any) -> _Node:
        node = self.compile(tp)
        if default is None and not node.nullable:
            node = _UnionNode([node, _NULL])  # ``x: str = None`` means "or null"
        return node


# ---------------------------------------------------------------------------------------
# a function's arguments


@attrs.frozen
class Param:
    """One model-visible parameter: its name, type hint, default and description."""

    name: str
    annotation: Any
    default: Any = _MISSING
    description: str | None = None

    @property
    def required(self) -> bool:
        return self.default is _MISSING


class ArgumentsSchema:
    """The object schema of a tool's parameters and the validator that matches it."""

    __slots__ = ("_fields", "_names", "_plan", "schema", "tool")

    def __init__(self, tool: str, params: Sequence[Param]) -> None:
        compiler = _Compiler()
        fields = []
        for p in params:
            try:
                node = compiler.parameter(p.annotation, p.default)
            except SchemaError as exc:
                raise SchemaError(f"tool {tool!r}, parameter {p.name!r}: {exc}") from None
            fields.append(_Field(p.name, node, p.required, p.default, p.description))
        self.tool = tool
        self._fields: tuple[_Field, ...] = tuple(fields)
        self._names = frozenset(f.name for f in fields)
        self._plan = tuple((f.name, f.node.convert, f.required) for f in fields)
        defs = _Defs()
        properties = {
            f.name: _property_schema(f.node, f.default, f.description, defs) for f in fields
        }
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        required = [f.name for f in fields if f.required]
        if required:
            schema["required"] = required
        schema["additionalProperties"] = False
        if defs.schemas:
            schema["$defs"] = defs.schemas
        self.schema: dict[str, Any] = schema

    def validate(self, arguments: Mapping[str, Any], *, tool: str | None = None) -> dict[str, Any]:
        """The converted arguments, or ToolArgumentError listing every problem found."""
        # fast path: valid arguments, no bookkeeping; any doubt goes to the full report
        out: dict[str, Any] = {}
        try:
            for name, convert, required in self._plan:
                if name in arguments:
                    out[name] = convert(arguments[name], False)
                elif required:
                    break
            else:
                if len(out) == len(arguments):
                    return out
        except _Invalid:
            pass
        raise ToolArgumentError(tool or self.tool, self._problems(arguments))

    def _problems(self, arguments: Mapping[str, Any]) -> list[str]:
        problems: list[str] = []
        for key in arguments:
            if key not in self._names:
                takes = ", ".join(f.name for f in self._fields)
                hint = f"this tool takes: {takes}" if takes else "this tool takes no arguments"
                problems.append(f"unexpected argument {key!r} ({hint})")
        for f in self._fields:
            if f.name not in arguments:
                if f.required:
                    problems.append(f"missing required argument {f.name!r} ({f.node.describe()})")
                continue
            try:
                f.node.convert(arguments[f.name], False)
            except _Invalid as exc:
                problems.append(f"{exc.path(f.name)!r}: {exc.message}")
        return problems
