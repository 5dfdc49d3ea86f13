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

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args, get_origin

import attrs

from ._schema_tree import (
    ANY,
    BOOL,
    DICT_ORIGINS,
    FLOAT,
    INT,
    LIST_ORIGINS,
    MISSING,
    NULL,
    SET_ORIGINS,
    STR,
    ArrayNode,
    ChoiceNode,
    ClassNode,
    Defs,
    Described,
    DictNode,
    Field,
    Invalid,
    Node,
    TupleNode,
    UnionNode,
    metadata_text,
    own_doc,
    property_schema,
)
from .docstrings import Docstring, parse_docstring
from .errors import TinyCtxError
from .json_value import to_json_value

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


class _Compiler:
    def __init__(self) -> None:
        self._classes: dict[type, ClassNode] = {}

    def compile(self, tp: Any) -> Node:
        if tp is Any or tp is object:
            return ANY
        if tp is None or tp is type(None):
            return NULL
        supertype = getattr(tp, "__supertype__", None)
        if supertype is not None:  # NewType
            return self.compile(supertype)
        origin, args = get_origin(tp), get_args(tp)
        if origin is typing.Annotated:
            return self._annotated(args[0], args[1:])
        if origin is typing.Union or origin is types.UnionType:
            return self._union(args)
        if origin is Literal:
            return ChoiceNode(self._literal_choices(args))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self._enum(tp)
        if tp is str:
            return STR
        if tp is bool:
            return BOOL
        if tp is int:
            return INT
        if tp is float:
            return FLOAT
        if tp in LIST_ORIGINS or origin in LIST_ORIGINS:
            return ArrayNode(self.compile(args[0]) if args else ANY, list, unique=False)
        if tp is tuple or tp is typing.Tuple:  # noqa: UP006
            return ArrayNode(ANY, tuple, unique=False)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return ArrayNode(self.compile(args[0]), tuple, unique=False)
            return TupleNode([self.compile(a) for a in args])
        if tp in SET_ORIGINS or origin in SET_ORIGINS:
            item = self.compile(args[0]) if args else ANY
            if not item.hashable:
                what = repr(args[0]) if args else "any value"
                raise SchemaError(f"set items must be hashable, {what} is not (say set[str])")
            container = frozenset if (origin or tp) is frozenset else set
            return ArrayNode(item, container, unique=True)
        if tp in DICT_ORIGINS or origin in DICT_ORIGINS:
            if args and args[0] not in (str, Any):
                raise SchemaError(f"object keys are strings: {tp!r} needs str keys")
            return DictNode(self.compile(args[1]) if args else ANY)
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

    def _annotated(self, inner: Any, metadata: Sequence[Any]) -> Node:
        for meta in metadata:
            if isinstance(meta, RuntimeMarker):
                raise SchemaError(
                    f"{meta!r} marks a whole parameter as injected; it cannot be nested "
                    f"inside another type"
                )
        node = self.compile(inner)
        texts = [t for t in map(metadata_text, metadata) if t]
        return Described(node, " ".join(texts)) if texts else node

    def _union(self, args: Sequence[Any]) -> Node:
        options = [self.compile(a) for a in args]
        return options[0] if len(options) == 1 else UnionNode(options)

    @staticmethod
    def _literal_choices(args: Sequence[Any]) -> list[tuple[Any, Any]]:
        choices = []
        for value in args:
            json_value = value.value if isinstance(value, enum.Enum) else value
            if not (json_value is None or isinstance(json_value, (str, int, float, bool))):
                raise SchemaError(f"Literal value {value!r} is not a JSON scalar")
            choices.append((json_value, value))
        return choices

    def _enum(self, cls: type[enum.Enum]) -> Node:
        doc = own_doc(cls)
        description = inspect.cleandoc(doc) if doc else None
        return ChoiceNode(self._literal_choices(list(cls)), cls.__name__, description)

    def _class(self, cls: type, kind: Literal["attrs", "dataclass", "typeddict"]) -> Node:
        node = self._classes.get(cls)
        if node is not None:
            return node
        node = self._classes[cls] = ClassNode(cls, kind)  # registered first: recursion
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception as exc:
            raise SchemaError(f"cannot resolve the type hints of {cls.__name__}: {exc}") from exc
        doc = parse_docstring(own_doc(cls))
        node.description = doc.description or None
        fields: list[Field] = []
        if kind == "typeddict":
            required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
            for name, tp in hints.items():
                # explicit markers win: with string annotations (PEP 563) Python 3.11
                # cannot see them when it computes __required_keys__
                required = name in required_keys
                while get_origin(tp) in _REQUIRED_MARKERS:
                    required = get_origin(tp) in (typing.Required, _te_required)
                    tp = get_args(tp)[0]
                fields.append(self._field(cls, name, tp, required, MISSING, doc))
        elif kind == "attrs":
            for a in attrs.fields(cls):
                if not a.init:
                    continue
                tp = hints.get(a.name, a.type if a.type is not None else Any)
                default = a.default
                required = default is attrs.NOTHING
                if required or isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    default = MISSING
                text = a.metadata.get("description") if a.metadata else None
                fields.append(self._field(cls, a.alias, tp, required, default, doc, text))
        else:
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                has_default = f.default is not dataclasses.MISSING
                required = not has_default and f.default_factory is dataclasses.MISSING
                default = f.default if has_default else MISSING
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
    ) -> Field:
        try:
            node = self.compile(tp)
        except SchemaError as exc:
            raise SchemaError(f"{cls.__name__}.{name}: {exc}") from None
        return Field(name, node, required, default, text or doc.params.get(name))

    def parameter(self, tp: Any, default: Any) -> Node:
        node = self.compile(tp)
        if default is None and not node.nullable:
            node = UnionNode([node, NULL])  # ``x: str = None`` means "or null"
        return node


# ---------------------------------------------------------------------------------------
# a function's arguments


@attrs.frozen
class Param:
    """One model-visible parameter: its name, type hint, default and description.

    Args:
        name: The parameter's name, as the model sends it.
        annotation: Its type hint (what the schema and the check come from).
        default: Its default; none means the parameter is required.
        description: The schema's description of it, or None.
    """

    name: str
    annotation: Any
    default: Any = MISSING
    description: str | None = None

    @property
    def required(self) -> bool:
        return self.default is MISSING


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
            fields.append(Field(p.name, node, p.required, p.default, p.description))
        self.tool = tool
        self._fields: tuple[Field, ...] = tuple(fields)
        self._names = frozenset(f.name for f in fields)
        self._plan = tuple((f.name, f.node.convert, f.required) for f in fields)
        defs = Defs()
        properties = {
            f.name: property_schema(f.node, f.default, f.description, defs) for f in fields
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
        except Invalid:
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
            except Invalid as exc:
                problems.append(f"{exc.path(f.name)!r}: {exc.message}")
        return problems
