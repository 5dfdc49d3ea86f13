"""The compiled type tree of :mod:`tinyctx.schema`: one node per type, each giving
its JSON Schema and converting (or refusing) a value of it."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import attrs

from .frozen import FrozenDict, thaw
from .json_value import json_key, shown_value, to_json_value

MISSING: Any = inspect.Parameter.empty


# ---------------------------------------------------------------------------------------
# the compiled type tree


class Invalid(Exception):
    """``shape_ok``: the value had the right JSON type and failed inside (a union reports
    such an error rather than "expected one of ...")."""

    def __init__(self, message: str, *, shape_ok: bool = True) -> None:
        self.message = message
        self.shape_ok = shape_ok
        self.where: list[str] = []  # path segments, innermost first: built only on failure

    def at(self, segment: str) -> Invalid:
        self.where.append(segment)
        return self

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.where))


def _fail(expected: str, value: Any) -> NoReturn:
    raise Invalid(f"expected {expected}, got {shown_value(value)}", shape_ok=False)


class Defs:
    """Names and schemas of the classes a schema references through ``$defs``."""

    def __init__(self) -> None:
        self.names: dict[ClassNode, str] = {}
        self.schemas: dict[str, dict[str, Any]] = {}

    def ref(self, node: ClassNode) -> dict[str, Any]:
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


class Node:
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

    def schema(self, defs: Defs) -> dict[str, Any]:
        raise NotImplementedError

    def convert(self, value: Any, strict: bool) -> Any:
        """The value as the signature wants it, or ``Invalid``. ``strict`` refuses the
        numeric coercions (int <-> float), so a union tries exact matches first."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class _AnyNode(Node):
    __slots__ = ()

    @property
    def nullable(self) -> bool:
        return True

    @property
    def hashable(self) -> bool:
        return False

    def schema(self, defs: Defs) -> dict[str, Any]:
        return {}

    def convert(self, value: Any, strict: bool) -> Any:
        return thaw(value)

    def describe(self) -> str:
        return "any value"


class _Scalar(Node):
    __slots__ = ("_check", "_phrase", "_type")

    def __init__(self, json_type: str, phrase: str, check: Callable[[Any], bool]) -> None:
        self._type = json_type
        self._phrase = phrase
        self._check = check

    @property
    def nullable(self) -> bool:
        return self._type == "null"

    def schema(self, defs: Defs) -> dict[str, Any]:
        return {"type": self._type}

    def convert(self, value: Any, strict: bool) -> Any:
        if self._check(value):
            return value
        _fail(self._phrase, value)

    def describe(self) -> str:
        return self._phrase


class _StrNode(Node):
    __slots__ = ()

    def schema(self, defs: Defs) -> dict[str, Any]:
        return {"type": "string"}

    def convert(self, value: Any, strict: bool) -> Any:
        if isinstance(value, str):
            return value
        _fail("a string", value)

    def describe(self) -> str:
        return "a string"


class _IntNode(Node):
    __slots__ = ()

    def schema(self, defs: Defs) -> dict[str, Any]:
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


class _FloatNode(Node):
    __slots__ = ()

    def schema(self, defs: Defs) -> dict[str, Any]:
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


class ChoiceNode(Node):
    """``Literal[...]`` and ``Enum``: a fixed set of JSON scalars, each mapped to its value."""

    __slots__ = ("_by_key", "_description", "_json", "_phrase", "_title")

    def __init__(
        self,
        choices: Sequence[tuple[Any, Any]],
        title: str | None = None,
        description: str | None = None,
    ) -> None:
        self._json = [j for j, _ in choices]
        self._by_key = {json_key(j): python for j, python in choices}
        self._phrase = "one of " + ", ".join(shown_value(j) for j in self._json)
        self._title = title
        self._description = description

    @property
    def nullable(self) -> bool:
        return ("null",) in self._by_key

    def schema(self, defs: Defs) -> dict[str, Any]:
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
        key = json_key(value)
        if key in self._by_key:
            return self._by_key[key]
        _fail(self._phrase, value)

    def describe(self) -> str:
        return self._phrase


class Described(Node):
    __slots__ = ("_description", "_inner")

    def __init__(self, inner: Node, description: str) -> None:
        self._inner = inner
        self._description = description

    @property
    def nullable(self) -> bool:
        return self._inner.nullable

    @property
    def hashable(self) -> bool:
        return self._inner.hashable

    def schema(self, defs: Defs) -> dict[str, Any]:
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


class ArrayNode(Node):
    __slots__ = ("_container", "_item", "_unique")

    def __init__(self, item: Node, container: Callable[[list[Any]], Any], unique: bool) -> None:
        self._item = item
        self._container = container
        self._unique = unique

    @property
    def hashable(self) -> bool:
        return self._container is tuple and self._item.hashable

    def schema(self, defs: Defs) -> dict[str, Any]:
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
                key = json_key(item)
                if key in seen:
                    raise Invalid(f"duplicate item {shown_value(item)}").at(f"[{index}]")
                seen.add(key)
        convert = self._item.convert
        out = []
        for index, item in enumerate(value):
            try:
                out.append(convert(item, strict))
            except Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return self._container(out)

    def describe(self) -> str:
        what = "an array of unique items" if self._unique else "an array"
        inner = self._item.describe()
        return what if inner == "any value" else f"{what} ({inner} each)"


class TupleNode(Node):
    __slots__ = ("_items",)

    def __init__(self, items: Sequence[Node]) -> None:
        self._items = tuple(items)

    @property
    def hashable(self) -> bool:
        return all(i.hashable for i in self._items)

    def schema(self, defs: Defs) -> dict[str, Any]:
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
            except Invalid as exc:
                raise exc.at(f"[{index}]") from None
        return tuple(out)

    def describe(self) -> str:
        n = len(self._items)
        kinds = ", ".join(i.describe() for i in self._items)
        return f"an array of exactly {n} items [{kinds}]"


class DictNode(Node):
    __slots__ = ("_value",)

    @property
    def hashable(self) -> bool:
        return False

    def __init__(self, value: Node) -> None:
        self._value = value

    def schema(self, defs: Defs) -> dict[str, Any]:
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
            except Invalid as exc:
                raise exc.at(f".{key}") from None
        return out

    def describe(self) -> str:
        inner = self._value.describe()
        return "an object" if inner == "any value" else f"an object ({inner} per key)"


class UnionNode(Node):
    __slots__ = ("_options",)

    def __init__(self, options: Sequence[Node]) -> None:
        self._options = tuple(options)

    @property
    def nullable(self) -> bool:
        return any(o.nullable for o in self._options)

    @property
    def hashable(self) -> bool:
        return all(o.hashable for o in self._options)

    def schema(self, defs: Defs) -> dict[str, Any]:
        schemas = [o.schema(defs) for o in self._options]
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            return {"type": list(dict.fromkeys(s["type"] for s in schemas))}
        return {"anyOf": schemas}

    def convert(self, value: Any, strict: bool) -> Any:
        closest: Invalid | None = None
        passes = (True,) if strict else (True, False)
        for pass_strict in passes:
            closest = None  # report what the most lenient pass found
            for option in self._options:
                try:
                    return option.convert(value, pass_strict)
                except Invalid as exc:
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
class Field:
    name: str  # the JSON property name (attrs: the init alias)
    node: Node
    required: bool
    default: Any = MISSING
    description: str | None = None


class ClassNode(Node):
    """attrs classes, dataclasses and TypedDicts: an object with known properties."""

    __slots__ = ("cls", "description", "fields", "kind")

    def __init__(self, cls: type, kind: Literal["attrs", "dataclass", "typeddict"]) -> None:
        self.cls = cls
        self.kind = kind
        self.fields: tuple[Field, ...] = ()
        self.description: str | None = None

    @property
    def hashable(self) -> bool:
        return self.kind != "typeddict" and getattr(self.cls, "__hash__", None) is not None

    def definition(self, defs: Defs) -> dict[str, Any]:
        properties = {
            f.name: property_schema(f.node, f.default, f.description, defs) for f in self.fields
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

    def schema(self, defs: Defs) -> dict[str, Any]:
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
                except Invalid as exc:
                    raise exc.at(f".{name}") from None
            elif f.required:
                raise Invalid(f"missing required property {name!r} ({f.node.describe()})")
        if len(out) != len(value):
            known = {f.name for f in self.fields}
            unexpected = next(key for key in value if key not in known)
            allowed = ", ".join(sorted(known)) or "none"
            raise Invalid(f"unexpected property {unexpected!r} (allowed: {allowed})")
        if self.kind == "typeddict":
            return out
        try:
            return self.cls(**out)
        except Exception as exc:  # the class's own validators: report, do not crash
            raise Invalid(f"{self.cls.__name__} rejected the value: {exc}") from None

    def describe(self) -> str:
        return f"an object {self.cls.__name__} with properties " + (
            ", ".join(f.name + ("" if f.required else "?") for f in self.fields) or "none"
        )


def property_schema(
    node: Node, default: Any, description: str | None, defs: Defs
) -> dict[str, Any]:
    out = node.schema(defs)
    # Annotated[T, "..."] wins over the docstring, which wins over the type's own doc
    if description and not isinstance(node, Described):
        out = {**out, "description": description}
    if default is not MISSING:
        # a default that is not JSON stays unseen by the model, and still applies
        with contextlib.suppress(TypeError):
            out = {**out, "default": to_json_value(default)}
    return out


STR = _StrNode()
BOOL = _Scalar("boolean", "a boolean (true or false)", lambda v: v is True or v is False)
NULL = _Scalar("null", "null", lambda v: v is None)
ANY = _AnyNode()
INT = _IntNode()
FLOAT = _FloatNode()

LIST_ORIGINS: tuple[Any, ...] = (list, Sequence, typing.MutableSequence, Iterable)
SET_ORIGINS: tuple[Any, ...] = (set, frozenset, typing.AbstractSet, typing.MutableSet)
DICT_ORIGINS: tuple[Any, ...] = (dict, Mapping, typing.MutableMapping)


def metadata_text(meta: object) -> str | None:
    if isinstance(meta, str):
        return meta
    doc = getattr(meta, "documentation", None)  # PEP 727 ``Doc("...")``
    return doc if isinstance(doc, str) else None


def own_doc(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or not doc.strip():
        return None
    if dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
        return None  # the signature dataclasses writes when there is no docstring
    if doc == "An enumeration.":
        return None
    return doc
