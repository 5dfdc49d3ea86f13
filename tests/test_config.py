"""tinyctx.config: declared validators, and the layer name every layer checks."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import ConfigError, Layer
from tinyctx.config import (
    each,
    fraction,
    function,
    implements,
    integer,
    number,
    one_of,
    optional,
    owned_by,
    text,
)
from tinyctx.middleware import (
    BudgetGuard,
    CallLimits,
    ContextView,
    ControlOutcomes,
    Microcompact,
    Retry,
    SessionMemory,
    ToolResultBudget,
    ViewSpec,
)
from tinyctx.tokens import TokenCounter


@attrs.frozen
class Settings:
    """A user-facing settings class declared with the validators."""

    count: int = attrs.field(default=1, validator=integer(minimum=1, maximum=10))
    ratio: float = attrs.field(default=0.5, validator=fraction())
    mode: str = attrs.field(default="a", validator=one_of(("a", "b")))
    label: str | None = attrs.field(default=None, validator=optional(text()))


@attrs.frozen
class Outer:
    """A class that builds ``Settings`` from its own arguments."""

    settings: Settings

    @classmethod
    def build(cls, **options: Any) -> Outer:
        with owned_by("Outer"):
            return cls(Settings(**options))


class TestValidators:
    """Each validator accepts what it says and refuses the rest with a ConfigError."""

    @given(st.integers(min_value=1, max_value=10))
    def test_integer_in_bounds_is_kept(self, value: int) -> None:
        """Every int within the bounds is accepted unchanged."""
        assert Settings(count=value).count == value

    @given(st.one_of(st.integers().filter(lambda v: not 1 <= v <= 10), st.booleans(), st.floats()))
    def test_integer_out_of_bounds_names_field_value_and_range(self, value: object) -> None:
        """Out-of-range ints, bools and floats fail naming the class, field and range."""
        with pytest.raises(ConfigError) as info:
            Settings(count=value)  # type: ignore[arg-type]
        assert (info.value.owner, info.value.field) == ("Settings", "count")
        assert info.value.value is value
        assert info.value.allowed == "an integer in [1, 10]"

    @given(st.floats(allow_nan=True, allow_infinity=True))
    def test_fraction(self, value: float) -> None:
        """A fraction is a number in (0, 1]; NaN and infinities are refused."""
        if 0 < value <= 1:
            assert Settings(ratio=value).ratio == value
        else:
            with pytest.raises(ConfigError, match=r"Settings\.ratio=.*\(0, 1\]"):
                Settings(ratio=value)

    def test_fraction_ends(self) -> None:
        """``zero`` and ``one`` choose which ends of [0, 1] are allowed."""
        check = fraction(zero=True, one=False)
        assert check.check(0, "f") == 0
        with pytest.raises(ConfigError, match=r"\[0, 1\)"):
            check.check(1, "f")
        with pytest.raises(ConfigError):
            check.check(True, "f")

    def test_number_is_finite_and_bounded(self) -> None:
        """``number`` refuses bools, NaN, infinity and values past its bounds."""
        check = number(minimum=0)
        assert check.check(2.5, "delay") == 2.5
        for bad in (True, math.nan, math.inf, -1, "1"):
            with pytest.raises(ConfigError, match="delay"):
                check.check(bad, "delay", "Retry")
        with pytest.raises(ConfigError, match="> 0"):
            number(above=0).check(0, "timeout")

    def test_one_of_does_not_confuse_bools_and_ints(self) -> None:
        """``one_of((0, 1))`` refuses True; the message lists the choices."""
        with pytest.raises(ConfigError, match=r"one of 0, 1"):
            one_of((0, 1)).check(True, "level")
        with pytest.raises(ConfigError, match=r"one of 'a', 'b'"):
            Settings(mode="c")

    def test_optional_text(self) -> None:
        """``optional(text())`` takes None or a non-empty string."""
        assert Settings(label=None).label is None
        with pytest.raises(ConfigError, match="a non-empty string or None"):
            Settings(label="")

    def test_implements_and_function(self) -> None:
        """``implements`` checks an instance, ``function`` a callable."""
        counter = implements(TokenCounter)
        with pytest.raises(ConfigError, match="an instance of TokenCounter"):
            counter.check(object(), "counter", "X")
        assert function().check(len, "fn") is len
        with pytest.raises(ConfigError, match="a callable"):
            function().check(3, "fn")

    @given(st.lists(st.sampled_from(("model", "tool", "stream", ""))))
    def test_each_checks_every_item(self, items: list[str]) -> None:
        """``each(one_of(...))`` keeps a collection whose every item is allowed, else names
        the field and what each item may be."""
        check = each(one_of(("model", "tool")))
        if all(item in ("model", "tool") for item in items):
            assert check.check(items, "hooks", "X") is items
        else:
            with pytest.raises(ConfigError, match=r"^X\.hooks=.*each one of 'model', 'tool'"):
                check.check(items, "hooks", "X")

    @pytest.mark.parametrize("bad", ["add", b"add", {"add": 1}, iter(["add"]), 3, None])
    def test_each_refuses_what_is_not_a_collection(self, bad: object) -> None:
        """One string (a collection of letters), a mapping, a one-pass iterator or a
        scalar is not a collection of names."""
        with pytest.raises(ConfigError, match="collection"):
            each(text()).check(bad, "include", "X")

    def test_each_empty_and_distinct(self) -> None:
        """``empty=False`` needs an item; ``distinct=True`` refuses a repeat, even of
        unhashable items."""
        with pytest.raises(ConfigError, match="non-empty collection"):
            each(text(), empty=False).check((), "review")
        with pytest.raises(ConfigError, match="distinct"):
            each(text(), distinct=True).check(["a", "a"], "allowed")
        with pytest.raises(ConfigError, match="distinct"):
            each(implements(list), distinct=True).check([[1], [1]], "rows")
        assert each(text(), distinct=True).check({"a": 1}.keys(), "names") is not None

    def test_text_not_blank(self) -> None:
        """``text(blank=False)`` refuses a string of only whitespace."""
        assert text(blank=False).check(" x ", "reason") == " x "
        with pytest.raises(ConfigError, match="not only whitespace"):
            text(blank=False).check(" \t", "reason")

    def test_owned_by_names_the_class_the_user_constructed(self) -> None:
        """A helper built inside ``owned_by`` blames the outer class."""
        with pytest.raises(ConfigError, match=r"^Outer\.count=0"):
            Outer.build(count=0)
        with pytest.raises(ConfigError, match=r"^Settings\.count=0"):
            Settings(count=0)


class TestLayerName:
    """Every layer's ``name`` (its state key) is checked when it is set."""

    @pytest.mark.parametrize(
        "build",
        [
            lambda name: CallLimits(model_calls=3, name=name),
            lambda name: Retry(name=name),
            lambda name: Microcompact(name=name),
            lambda name: ControlOutcomes(name=name),
            lambda name: ToolResultBudget(name=name),
            lambda name: BudgetGuard(name=name),
            lambda name: SessionMemory(name=name),
        ],
    )
    @pytest.mark.parametrize("bad", [5, "", 3.5, b"x"])
    def test_bad_name_fails_at_construction(self, build: Any, bad: object) -> None:
        """A name that is not a non-empty string is a ConfigError naming ``name``."""
        with pytest.raises(ConfigError) as info:
            build(bad)
        assert info.value.field == "name"
        assert info.value.value is bad

    def test_user_layer_name(self) -> None:
        """A user's own Layer subclass gets the same check, on the instance and the class."""

        class Mine(Layer):
            pass

        layer = Mine()
        layer.name = "mine"
        assert layer.name == "mine"
        with pytest.raises(ConfigError, match=r"^Mine\.name=5"):
            layer.name = 5  # type: ignore[assignment]
        with pytest.raises(ConfigError, match=r"^Bad\.name=''"):

            class Bad(Layer):
                name = ""

    def test_session_memory_blames_itself(self) -> None:
        """``SessionMemory(min_tokens=-1)`` names SessionMemory, not its thresholds class."""
        with pytest.raises(ConfigError, match=r"^SessionMemory\.min_tokens=-1"):
            SessionMemory(min_tokens=-1)


class TestDeclaredFields:
    """Settings that were not checked before now fail at construction, naming the field."""

    @pytest.mark.parametrize(
        ("options", "field"),
        [({"header": 1}, "header"), ({"header_tag": 3}, "header_tag")],
    )
    def test_view_spec_fields(self, options: dict[str, Any], field: str) -> None:
        """``ViewSpec(header=1)`` and ``ViewSpec(header_tag=3)`` are ConfigErrors."""
        with pytest.raises(ConfigError) as info:
            ViewSpec(**options)
        assert (info.value.owner, info.value.field) == ("ViewSpec", field)

    def test_nan_constant_backoff_is_refused_as_backoff(self) -> None:
        """A NaN constant backoff names ``Retry.backoff``, the argument the user gave."""
        with pytest.raises(ConfigError, match=r"^Retry\.backoff=nan"):
            Retry(backoff=math.nan)

    def test_context_view_subclass_is_named(self) -> None:
        """A bad field of a ContextView subclass names the subclass."""

        @attrs.frozen
        class MyView(ContextView):
            pass

        with pytest.raises(ConfigError, match=r"^MyView\.project_root=3"):
            MyView(project_root=3)  # type: ignore[arg-type]
