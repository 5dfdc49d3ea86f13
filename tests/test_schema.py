"""JSON Schema from type hints and argument validation: unit cases and generated signatures.

The property tests build tool functions with random parameter names, types and defaults
(injected parameters included) and hold the result to an independent JSON Schema
validator (``jsonschema``, draft 2020-12): the schema never mentions an injected parameter,
and the tool's validation accepts exactly what the schema accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import itertools
import json
import keyword
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, TypedDict, Union

import attrs
import jsonschema
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

from tinyctx import CancellationToken, EventSink, MemoryStore, RunContext, tool
from tinyctx.docstrings import parse_docstring
from tinyctx.frozen import freeze, thaw
from tinyctx.stores import Store
from tinyctx.testing import strategies as tst
from tinyctx.tools import FunctionTool, Inject, Injected, SchemaError, ToolArgumentError


def schema_of(t: FunctionTool) -> dict[str, Any]:
    return thaw(t.parameters)  # type: ignore[no-any-return]


def prop(t: FunctionTool, name: str) -> dict[str, Any]:
    return schema_of(t)["properties"][name]  # type: ignore[no-any-return]


# module-level types: a tool's hints are resolved in its module (PEP 563 strings)


class Color(enum.Enum):
    """A paint color."""

    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Filter:
    """Which documents to search.

    Attributes:
        tags: documents must carry every tag
    """

    tags: list[str]
    limit: int = 10
    child: Filter | None = None
    _secret: str = attrs.field(default="", metadata={"description": "an aliased field"})


@dataclasses.dataclass
class Window:
    start: int
    end: int = 0
    labels: list[str] = dataclasses.field(default_factory=list)


class Point(TypedDict):
    x: float
    y: float
    label: NotRequired[str]


class Loose(TypedDict, total=False):
    a: int


UserId = NewType("UserId", str)


def validate(t: FunctionTool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return t.arguments.validate(arguments, tool=t.name)


class TestSchemaFromHints:
    """Each supported type hint has the draft 2020-12 schema a provider expects."""

    def test_scalars_defaults_and_required(self) -> None:
        @tool
        async def f(s: str, i: int, x: float, b: bool, n: None, a: Any, d: int = 3) -> str:
            return ""

        schema = schema_of(f)
        assert schema["required"] == ["s", "i", "x", "b", "n", "a"]
        assert schema["additionalProperties"] is False
        assert [schema["properties"][k] for k in ("s", "i", "x", "b", "n", "a")] == [
            {"type": "string"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "null"},
            {},
        ]
        assert prop(f, "d") == {"type": "integer", "default": 3}
        jsonschema.Draft202012Validator.check_schema(schema)

    def test_literal_enum_and_newtype(self) -> None:
        @tool
        async def f(
            mode: Literal["fast", "slow"],
            mixed: Literal[1, "one", None],
            color: Color = Color.RED,
            level: Level = Level.LOW,
            user: UserId = UserId("u1"),
        ) -> str:
            return ""

        assert prop(f, "mode") == {"type": "string", "enum": ["fast", "slow"]}
        assert prop(f, "mixed") == {"enum": [1, "one", None]}
        assert prop(f, "color") == {
            "type": "string",
            "enum": ["red", "blue"],
            "title": "Color",
            "description": "A paint color.",
            "default": "red",
        }
        assert prop(f, "level") == {
            "type": "integer",
            "enum": [1, 2],
            "title": "Level",
            "default": 1,
        }
        assert prop(f, "user") == {"type": "string", "default": "u1"}

    def test_containers(self) -> None:
        @tool
        async def f(
            items: list[int],
            pair: tuple[str, int],
            many: tuple[float, ...],
            tags: set[str],
            scores: dict[str, float],
            anything: dict[str, Any],
            seq: Sequence[str] = (),
        ) -> str:
            return ""

        assert prop(f, "items") == {"type": "array", "items": {"type": "integer"}}
        assert prop(f, "pair") == {
            "type": "array",
            "prefixItems": [{"type": "string"}, {"type": "integer"}],
            "items": False,
            "minItems": 2,
            "maxItems": 2,
        }
        assert prop(f, "many") == {"type": "array", "items": {"type": "number"}}
        assert prop(f, "tags") == {
            "type": "array",
            "items": {"type": "string"},
            "uniqueItems": True,
        }
        assert prop(f, "scores") == {"type": "object", "additionalProperties": {"type": "number"}}
        assert prop(f, "anything") == {"type": "object"}
        assert prop(f, "seq") == {"type": "array", "items": {"type": "string"}, "default": []}

    def test_optional_and_unions(self) -> None:
        @tool
        async def f(
            a: Optional[int],  # noqa: UP045
            b: int | str,
            c: Union[list[int], None] = None,  # noqa: UP007
            d: str = None,  # type: ignore[assignment]
        ) -> str:
            return ""

        assert prop(f, "a") == {"type": ["integer", "null"]}
        assert prop(f, "b") == {"type": ["integer", "string"]}
        assert prop(f, "c") == {
            "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}],
            "default": None,
        }
        # a None default means "or null", so the schema admits what the function accepts
        assert prop(f, "d") == {"type": ["string", "null"], "default": None}

    def test_classes_go_to_defs_and_recursion_works(self) -> None:
        @tool
        async def f(flt: Filter, win: Window, pt: Point, loose: Loose) -> str:
            return ""

        schema = schema_of(f)
        assert prop(f, "flt") == {"$ref": "#/$defs/Filter"}
        assert schema["$defs"]["Filter"] == {
            "type": "object",
            "title": "Filter",
            "description": "Which documents to search.",
            "properties": {
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "documents must carry every tag",
                },
                "limit": {"type": "integer", "default": 10},
                "child": {
                    "anyOf": [{"$ref": "#/$defs/Filter"}, {"type": "null"}],
                    "default": None,
                },
                "secret": {"type": "string", "description": "an aliased field", "default": ""},
            },
            "required": ["tags"],
            "additionalProperties": False,
        }
        assert schema["$defs"]["Window"]["required"] == ["start"]
        assert "description" not in schema["$defs"]["Window"]  # no generated dataclass doc
        assert schema["$defs"]["Point"]["required"] == ["x", "y"]
        assert "required" not in schema["$defs"]["Loose"]
        jsonschema.Draft202012Validator.check_schema(schema)

    def test_two_classes_with_one_name_get_distinct_defs(self) -> None:
        first = attrs.make_class("Item", {"a": attrs.field(type=int)})
        second = attrs.make_class("Item", {"b": attrs.field(type=str)})

        async def f(x: Any, y: Any) -> str:
            return ""

        f.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("x", inspect.Parameter.KEYWORD_ONLY, annotation=first),
                inspect.Parameter("y", inspect.Parameter.KEYWORD_ONLY, annotation=second),
            ]
        )
        schema = schema_of(tool(f))
        assert sorted(schema["$defs"]) == ["Item", "Item2"]
        assert schema["properties"]["y"] == {"$ref": "#/$defs/Item2"}

    def test_annotated_description_wins_over_the_docstring(self) -> None:
        @tool
        async def f(q: Annotated[str, "from Annotated"], n: int = 1) -> str:
            """Search.

            Args:
                q: from the docstring
                n: how many
            """
            return ""

        assert prop(f, "q")["description"] == "from Annotated"
        assert prop(f, "n")["description"] == "how many"
        assert f.description == "Search."

    def test_parameter_text_beats_the_type_doc_and_annotated_beats_both(self) -> None:
        @tool
        async def f(color: Color, shade: Annotated[Color, "explicit"], other: Color) -> str:
            """Pick colors.

            Args:
                color: the parameter's own text
                shade: loses to Annotated
            """
            return ""

        assert prop(f, "color")["description"] == "the parameter's own text"
        assert prop(f, "shade")["description"] == "explicit"
        assert prop(f, "other")["description"] == "A paint color."
        assert f.description == "Pick colors."

    def test_bare_generics_accept_any_items(self) -> None:
        @tool
        async def f(a: list, b: tuple, c: typing.Tuple, d: dict) -> str:  # type: ignore[type-arg]  # noqa: UP006
            return ""

        assert [prop(f, k) for k in "abcd"] == [
            {"type": "array"},
            {"type": "array"},
            {"type": "array"},
            {"type": "object"},
        ]
        with pytest.raises(SchemaError, match="set items must be hashable, any value is not"):

            @tool
            async def g(e: set) -> str:  # type: ignore[type-arg]
                return ""

    def test_unsupported_hints_fail_when_the_tool_is_defined(self) -> None:
        with pytest.raises(SchemaError, match=r"tool 'f', parameter 'when': no JSON Schema"):

            @tool
            async def f(when: bytes) -> str:
                return ""

        with pytest.raises(SchemaError, match="object keys are strings"):

            @tool
            async def g(m: dict[int, str]) -> str:
                return ""

        with pytest.raises(SchemaError, match="set items must be hashable"):

            @tool
            async def h(s: set[list[int]]) -> str:  # type: ignore[type-arg]
                return ""

        with pytest.raises(SchemaError, match="cannot be nested"):

            @tool
            async def k(xs: list[Injected[Store]]) -> str:
                return ""

        with pytest.raises(SchemaError, match=r"\*args and \*\*kwargs"):

            @tool
            async def v(*args: int) -> str:
                return ""


class TestValidation:
    """Arguments are checked against the signature; safe coercions only."""

    @staticmethod
    def _tool() -> FunctionTool:
        @tool
        async def f(
            ratio: float,
            count: int = 0,
            pair: tuple[int, str] = (0, ""),
            flt: Filter | None = None,
            win: Window | None = None,
            pt: Point | None = None,
            color: Color = Color.RED,
            tags: frozenset[str] = frozenset(),
            mixed: int | float = 0,
        ) -> str:
            return ""

        return f

    def test_safe_coercions(self) -> None:
        values = validate(
            self._tool(),
            {
                "ratio": 2,
                "count": 3.0,
                "pair": [1, "a"],
                "flt": {"tags": ["x"], "child": {"tags": []}, "secret": "s"},
                "win": {"start": 1},
                "pt": {"x": 1, "y": 2.5},
                "color": "blue",
                "tags": ["a", "b"],
                "mixed": 4,
            },
        )
        assert values["ratio"] == 2.0 and type(values["ratio"]) is float
        assert values["count"] == 3 and type(values["count"]) is int
        assert values["pair"] == (1, "a")
        assert values["flt"] == Filter(["x"], child=Filter([]), secret="s")
        assert values["win"] == Window(1)
        assert values["pt"] == {"x": 1.0, "y": 2.5}
        assert values["color"] is Color.BLUE
        assert values["tags"] == frozenset({"a", "b"})
        assert type(values["mixed"]) is int  # exact matches first: 4 stays an int

    def test_frozen_arguments_from_a_tool_call_validate_like_json(self) -> None:
        raw = {"ratio": 1.5, "pair": [1, "a"], "flt": {"tags": ["x"]}}
        assert validate(self._tool(), freeze(raw)) == validate(self._tool(), raw)

    @pytest.mark.parametrize(
        ("arguments", "expected"),
        [
            ({}, "missing required argument 'ratio' (a number)"),
            ({"ratio": "1"}, "'ratio': expected a number, got \"1\""),
            ({"ratio": True}, "'ratio': expected a number, got true"),
            ({"ratio": 1, "count": 1.5}, "'count': expected an integer, got 1.5"),
            ({"ratio": 1, "zz": 1}, "unexpected argument 'zz' (this tool takes: ratio, count"),
            ({"ratio": 1, "pair": [1]}, "'pair': expected an array of exactly 2 items"),
            ({"ratio": 1, "flt": {"tags": [1]}}, "'flt.tags[0]': expected a string, got 1"),
            ({"ratio": 1, "flt": {}}, "'flt': missing required property 'tags'"),
            ({"ratio": 1, "flt": {"tags": [], "x": 0}}, "'flt': unexpected property 'x'"),
            ({"ratio": 1, "color": "green"}, '\'color\': expected one of "red", "blue"'),
            ({"ratio": 1, "tags": ["a", "a"]}, "'tags[1]': duplicate item \"a\""),
            ({"ratio": 1, "pt": {"x": "no", "y": 1}}, "'pt.x': expected a number"),
            ({"ratio": 1, "mixed": "x"}, "'mixed': expected one of: an integer; a number"),
        ],
    )
    def test_bad_arguments_name_the_parameter_and_what_was_expected(
        self, arguments: dict[str, Any], expected: str
    ) -> None:
        with pytest.raises(ToolArgumentError) as info:
            validate(self._tool(), arguments)
        assert expected in str(info.value)
        assert str(info.value).startswith("invalid arguments for tool 'f': ")

    def test_every_problem_is_reported_at_once(self) -> None:
        with pytest.raises(ToolArgumentError) as info:
            validate(self._tool(), {"count": "x", "extra": 1})
        assert len(info.value.problems) == 3

    def test_a_class_validator_rejection_is_an_argument_error(self) -> None:
        @attrs.frozen
        class Positive:
            n: int = attrs.field(validator=attrs.validators.gt(0))

        async def f(p: Any) -> str:
            return ""

        f.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("p", inspect.Parameter.KEYWORD_ONLY, annotation=Positive)]
        )
        with pytest.raises(ToolArgumentError, match="'p': Positive rejected the value"):
            validate(tool(f), {"p": {"n": -1}})


class TestDocstrings:
    """Google, NumPy and Sphinx docstrings give the description and parameter texts."""

    def test_google(self) -> None:
        doc = parse_docstring(
            """Find documents.

            Longer explanation.

            Args:
                query (str): what to look for,
                    continued here.
                limit: at most this many
            Returns:
                the documents
            """
        )
        assert doc.description == "Find documents.\n\nLonger explanation."
        assert doc.params == {
            "query": "what to look for, continued here.",
            "limit": "at most this many",
        }

    def test_numpy(self) -> None:
        doc = parse_docstring(
            """Find documents.

            Parameters
            ----------
            query : str
                what to look for
            limit : int, optional
                at most this many

            Returns
            -------
            list
            """
        )
        assert doc.description == "Find documents."
        assert doc.params == {"query": "what to look for", "limit": "at most this many"}

    def test_sphinx(self) -> None:
        doc = parse_docstring(
            """Find documents.

            :param query: what to look for
                continued
            :type query: str
            :param int limit: at most this many
            :returns: the documents
            """
        )
        assert doc.description == "Find documents."
        assert doc.params == {"query": "what to look for continued", "limit": "at most this many"}

    def test_empty(self) -> None:
        assert parse_docstring(None).description == ""
        assert parse_docstring("Just text.").params == {}


# ---------------------------------------------------------------------------------------
# generated signatures
#
# A test-side type ("Spec") knows its hint, how to draw a JSON value the schema accepts and
# how to check the converted Python value. Values are drawn with module-level strategies
# only: building strategies per example would cost more than the property itself.

Gen = Callable[[st.DrawFn], Any]


@attrs.frozen
class Spec:
    hint: Any
    gen: Gen = attrs.field(repr=False)
    check: Callable[[Any], bool] = attrs.field(repr=False)


_names = itertools.count()
_JSON_LEAF = tst.json_values | st.floats(allow_nan=False, allow_infinity=False)
ARBITRARY = st.recursive(
    _JSON_LEAF,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=6,
)
_SMALL = st.integers(0, 3)
_DIGIT = st.integers(0, 9)
_INDEX = st.integers(0, 255)
_BOOL = st.booleans()
_TEXT = st.text(alphabet="abc xy", max_size=4)
_INT = st.integers(-(10**6), 10**6) | st.integers(-1000, 1000).map(float)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000)
_KEYS = st.text(alphabet="kq", max_size=2)
_LETTERS = "abcdefghijklmnopqrstuvwxy"  # no "z": "zinj..." and "zextra" are reserved
_NAMES = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(_LETTERS),
    st.text(alphabet=_LETTERS + "0123456789_", max_size=5),
).filter(lambda n: not keyword.iskeyword(n))
_CHOICE_POOL = st.text(alphabet="ab", max_size=2) | st.integers(-3, 3) | st.booleans() | st.none()


def _pick(draw: st.DrawFn, items: Sequence[Any]) -> Any:
    return items[draw(_INDEX) % len(items)]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _many(draw: st.DrawFn, gen: Gen) -> list[Any]:
    return [gen(draw) for _ in range(draw(_SMALL))]


SCALAR_SPECS = [
    Spec(str, lambda d: d(_TEXT), lambda v: type(v) is str),
    Spec(int, lambda d: d(_INT), lambda v: type(v) is int),
    Spec(float, lambda d: d(_FLOAT), lambda v: type(v) is float),
    Spec(bool, lambda d: d(_BOOL), lambda v: type(v) is bool),
    Spec(type(None), lambda d: None, lambda v: v is None),
    Spec(Any, lambda d: d(ARBITRARY), lambda v: True),
]


def _choice_spec(draw: st.DrawFn) -> Spec:
    if draw(_BOOL):
        choices = draw(
            st.lists(_CHOICE_POOL, min_size=1, max_size=4, unique_by=lambda v: (type(v), v))
        )
        hint = Literal.__getitem__(tuple(choices))  # type: ignore[attr-defined]
        return Spec(
            hint,
            lambda d: _pick(d, choices),
            lambda v: any(_same(v, c) for c in choices),
        )
    if draw(_BOOL):
        values: list[Any] = sorted({draw(_TEXT) for _ in range(draw(_SMALL) + 1)})
    else:
        values = sorted({draw(_DIGIT) for _ in range(draw(_SMALL) + 1)})
    cls = enum.Enum(f"E{next(_names)}", {f"M{i}": v for i, v in enumerate(values)})  # type: ignore[misc]
    return Spec(cls, lambda d: _pick(d, values), lambda v: isinstance(v, cls))


def _object_spec(draw: st.DrawFn, kind: str, depth: int) -> Spec:
    names = sorted({draw(_NAMES) for _ in range(draw(_SMALL) + 1)})
    fields = [(n, draw_spec(draw, depth + 1), draw(_BOOL)) for n in names]
    fields.sort(key=lambda f: not f[2])  # attrs and dataclasses: required fields first
    name = f"C{next(_names)}"
    if kind == "typeddict":
        hints = {n: s.hint if req else NotRequired[s.hint] for n, s, req in fields}
        cls: Any = TypedDict(name, hints)  # type: ignore[operator]
    elif kind == "attrs":
        cls = attrs.make_class(
            name,
            {
                n: attrs.field(type=s.hint) if req else attrs.field(type=s.hint, default=None)
                for n, s, req in fields
            },
        )
    else:
        cls = dataclasses.make_dataclass(
            name,
            [(n, s.hint) if req else (n, s.hint, dataclasses.field(default=None))
             for n, s, req in fields],
        )  # fmt: skip

    def gen(d: st.DrawFn) -> dict[str, Any]:
        return {n: s.gen(d) for n, s, req in fields if req or d(_BOOL)}

    def check(v: Any) -> bool:
        if kind == "typeddict":
            if type(v) is not dict:
                return False
            return all(s.check(v[n]) for n, s, _ in fields if n in v)
        if not isinstance(v, cls):
            return False
        return all(
            (getattr(v, n) is None and not req) or s.check(getattr(v, n)) for n, s, req in fields
        )

    return Spec(cls, gen, check)


_KINDS = st.sampled_from(
    ["scalar", "choice", "list", "tuple_var", "tuple_fixed", "dict", "optional", "union",
     "annotated", "set", "attrs", "dataclass", "typeddict"]
)  # fmt: skip


_LEAF_KINDS = st.sampled_from(["scalar", "choice"])


def draw_spec(draw: st.DrawFn, depth: int = 0) -> Spec:
    kind = draw(_KINDS) if depth < 2 else draw(_LEAF_KINDS)
    if kind == "scalar":
        return _pick(draw, SCALAR_SPECS)
    if kind == "choice":
        return _choice_spec(draw)
    if kind in ("attrs", "dataclass", "typeddict"):
        return _object_spec(draw, kind, depth)
    if kind == "set":
        return Spec(
            set[str],
            lambda d: sorted({d(_TEXT) for _ in range(d(_SMALL))}),
            lambda v: type(v) is set,
        )
    a = draw_spec(draw, depth + 1)
    if kind == "list":
        return Spec(
            list[a.hint],  # type: ignore[name-defined]
            lambda d: _many(d, a.gen),
            lambda v: type(v) is list and all(map(a.check, v)),
        )
    if kind == "tuple_var":
        return Spec(
            tuple[a.hint, ...],  # type: ignore[name-defined]
            lambda d: _many(d, a.gen),
            lambda v: type(v) is tuple and all(map(a.check, v)),
        )
    if kind == "dict":
        return Spec(
            dict[str, a.hint],  # type: ignore[name-defined]
            lambda d: {d(_KEYS): a.gen(d) for _ in range(d(_SMALL))},
            lambda v: type(v) is dict and all(map(a.check, v.values())),
        )
    if kind == "optional":
        return Spec(
            Optional[a.hint],  # noqa: UP045
            lambda d: a.gen(d) if d(_BOOL) else None,
            lambda v: v is None or a.check(v),
        )
    if kind == "annotated":
        return Spec(Annotated[a.hint, "a described value"], a.gen, a.check)
    b = draw_spec(draw, depth + 1)
    if kind == "tuple_fixed":
        return Spec(
            tuple[a.hint, b.hint],  # type: ignore[name-defined]
            lambda d: [a.gen(d), b.gen(d)],
            lambda v: type(v) is tuple and len(v) == 2 and a.check(v[0]) and b.check(v[1]),
        )
    return Spec(
        Union[a.hint, b.hint],  # noqa: UP007
        lambda d: a.gen(d) if d(_BOOL) else b.gen(d),
        lambda v: a.check(v) or b.check(v),
    )


@attrs.frozen
class AppData:
    user: str = "ada"


# what an injected parameter may ask for, and where the injected value is in a context
INJECTABLE: list[tuple[Any, Callable[[RunContext[Any], str], Any]]] = [
    (Injected[RunContext[Any]], lambda ctx, name: ctx),
    (Injected[CancellationToken], lambda ctx, name: ctx.cancellation),
    (Injected[EventSink], lambda ctx, name: ctx.events),
    (Injected[AppData], lambda ctx, name: ctx.data),
    (Injected[Store], lambda ctx, name: ctx.stores[name]),
    (Annotated[Store, Inject(store="zinjshared")], lambda ctx, name: ctx.stores["zinjshared"]),
    (Optional[Injected[MemoryStore]], lambda ctx, name: ctx.stores[name]),  # noqa: UP045
]


@attrs.frozen
class Generated:
    tool: FunctionTool
    visible: list[tuple[str, Spec, bool]]
    injected: list[tuple[str, Callable[[RunContext[Any], str], Any]]]
    received: list[dict[str, Any]]


@st.composite
def generated_tools(draw: st.DrawFn) -> Generated:
    """A tool over a random signature: keyword-only parameters in random order, some
    injected, defaults drawn from the accepted values (or None, which also admits null)."""
    visible: list[tuple[str, Spec, bool]] = []
    parameters = []
    for name in sorted({draw(_NAMES) for _ in range(draw(_SMALL) + draw(_BOOL))}):
        spec, required = draw_spec(draw), draw(_BOOL)
        default = inspect.Parameter.empty if required else (spec.gen(draw) if draw(_BOOL) else None)
        if default is None:
            spec = attrs.evolve(spec, check=lambda v, c=spec.check: v is None or c(v))
        visible.append((name, spec, required))
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=spec.hint, default=default
            )
        )
    picks = [_pick(draw, INJECTABLE) for _ in range(draw(_SMALL))]
    injected = [(f"zinj{i}", hint, where) for i, (hint, where) in enumerate(picks)]
    parameters += [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=hint)
        for n, hint, _ in injected
    ]
    parameters.sort(key=lambda _: draw(_INDEX))  # a random order
    received: list[dict[str, Any]] = []

    async def fn(**kwargs: Any) -> str:
        received.append(kwargs)
        return "ok"

    fn.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    # the docstring documents the injected parameters too: they must not leak from it
    args = "\n".join(f"    {p.name}: describes {p.name}" for p in parameters)
    fn.__doc__ = f"A generated tool.\n\nArgs:\n{args}\n"
    built = tool(name="generated")(fn)
    return Generated(built, visible, [(n, where) for n, _, where in injected], received)


def _mutate(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one spot changed: replaced, or (objects) a key added or dropped."""
    if isinstance(value, list) and value and draw(_BOOL):
        index = draw(_INDEX) % len(value)
        return [*value[:index], _mutate(draw, value[index]), *value[index + 1 :]]
    if isinstance(value, dict) and value and draw(_BOOL):
        key = _pick(draw, sorted(value))
        how = _pick(draw, ["descend", "drop", "add"])
        if how == "drop":
            return {k: v for k, v in value.items() if k != key}
        if how == "add":
            return {**value, "zextra": draw(_JSON_LEAF)}
        return {**value, key: _mutate(draw, value[key])}
    return draw(ARBITRARY)


_HOW = st.sampled_from(["match", "match", "mutate", "arbitrary", "omit"])


def draw_arguments(draw: st.DrawFn, generated: Generated) -> dict[str, Any]:
    """Arguments that match, nearly match (one spot mutated) or do not match at all."""
    out: dict[str, Any] = {}
    for name, spec, _ in generated.visible:
        how = draw(_HOW)
        if how == "omit":
            continue
        if how == "arbitrary":
            out[name] = draw(ARBITRARY)
        else:
            value = spec.gen(draw)
            out[name] = value if how == "match" else _mutate(draw, value)
    if draw(_DIGIT) == 0:
        out[_pick(draw, ["zextra", "zinj0"])] = draw(_JSON_LEAF)
    return out


@st.composite
def tools_and_arguments(draw: st.DrawFn) -> tuple[Generated, list[dict[str, Any]]]:
    generated = draw(generated_tools())
    return generated, [draw_arguments(draw, generated) for _ in range(3)]


@st.composite
def tools_and_valid_arguments(draw: st.DrawFn) -> tuple[Generated, dict[str, Any]]:
    generated = draw(generated_tools())
    valid = {n: s.gen(draw) for n, s, req in generated.visible if req or draw(_BOOL)}
    return generated, valid


def _context() -> RunContext[Any]:
    stores = {f"zinj{i}": MemoryStore() for i in range(4)} | {"zinjshared": MemoryStore()}
    return RunContext.new(data=AppData(), stores=stores)


class TestGeneratedSignatures:
    """For generated signatures: injected parameters never show, validation == schema."""

    @given(generated_tools())
    def test_schema_never_mentions_an_injected_parameter(self, generated: Generated) -> None:
        t = generated.tool
        schema = schema_of(t)
        jsonschema.Draft202012Validator.check_schema(schema)
        text = json.dumps(schema) + t.description + t.spec.description
        assert "zinj" not in text
        assert sorted(schema["properties"]) == sorted(n for n, _, _ in generated.visible)
        assert sorted(schema.get("required", [])) == sorted(
            n for n, _, req in generated.visible if req
        )
        assert {i.parameter for i in t.injections} == {n for n, _ in generated.injected}

    @given(tools_and_arguments())
    def test_validation_accepts_exactly_what_the_schema_accepts(
        self, case: tuple[Generated, list[dict[str, Any]]]
    ) -> None:
        generated, attempts = case
        validator = jsonschema.Draft202012Validator(schema_of(generated.tool))
        for arguments in attempts:
            expected = validator.is_valid(arguments)
            event("accepted" if expected else "rejected")
            try:
                values = validate(generated.tool, freeze(arguments))
            except ToolArgumentError as exc:
                note(str(exc))
                accepted = False
            else:
                accepted = True
                for name, spec, _ in generated.visible:
                    if name in values:
                        assert spec.check(values[name]), (name, values[name])
            errors = [e.message for e in validator.iter_errors(arguments)]
            assert accepted == expected, (arguments, errors)

    @given(tools_and_valid_arguments())
    async def test_invoke_fills_injected_values_and_passes_converted_arguments(
        self, case: tuple[Generated, dict[str, Any]]
    ) -> None:
        generated, valid = case
        generated.received.clear()
        ctx = _context()
        generated.tool.check_context(ctx)
        assert await generated.tool.invoke(valid, ctx) == "ok"
        (received,) = generated.received
        assert set(received) == set(valid) | {n for n, _ in generated.injected}
        for name, where in generated.injected:
            assert received[name] is where(ctx, name)
        for name, spec, _ in generated.visible:
            if name in valid:
                assert spec.check(received[name])
