"""Declared configuration: one set of validators for every setting tinyctx takes.

Each constructor below returns a :class:`Check`: an attrs field validator
(``field(validator=integer(minimum=0))``) that can also check a plain constructor argument
(``integer(minimum=1).check(value, "attempts", "Retry")``). Either way a bad value raises
:class:`~tinyctx.errors.ConfigError` naming the field, the value and what is allowed, and
the class the user constructed.

A class that builds a helper from the user's arguments (``SessionMemory`` builds
``MemoryThresholds``) wraps that in ``with owned_by("SessionMemory"):`` so an error names
``SessionMemory.min_tokens``, not the helper.

Integers are never bools here (``True`` is not a count), and numbers are finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar, cast

from .errors import ConfigError

__all__ = [
    "Check",
    "integer",
    "number",
    "fraction",
    "flag",
    "text",
    "one_of",
    "each",
    "implements",
    "function",
    "optional",
    "owned_by",
    "owner_of",
]

T = TypeVar("T")

_OWNER: ContextVar[str | None] = ContextVar("tinyctx_config_owner", default=None)


@contextmanager
def owned_by(owner: str) -> Iterator[None]:
    """Name ``owner`` in every ConfigError raised inside (outermost owner wins)."""
    if _OWNER.get() is not None:
        yield
        return
    token = _OWNER.set(owner)
    try:
        yield
    finally:
        _OWNER.reset(token)


def owner_of(instance: object) -> str:
    """The class name an error should name: the one set by :func:`owned_by`, else the
    instance's own class."""
    return _OWNER.get() or type(instance).__name__


class Check(Generic[T]):
    """A validator: ``test(value)`` says whether ``value`` is allowed; ``allowed`` says what is.

    Call it as an attrs validator ``(instance, attribute, value)``, or use :meth:`check`
    for a plain argument.
    """

    __slots__ = ("allowed", "test")

    def __init__(self, test: Callable[[Any], bool], allowed: str) -> None:
        self.test = test
        self.allowed = allowed

    def __call__(self, instance: object, attribute: Any, value: Any) -> None:
        if not self.test(value):
            raise ConfigError(attribute.name, value, self.allowed, owner=owner_of(instance))

    def check(self, value: object, field: str, owner: str = "") -> T:
        """``value`` itself when allowed, else ConfigError naming ``owner.field``."""
        if not self.test(value):
            raise ConfigError(field, value, self.allowed, owner=_OWNER.get() or owner)
        return cast(T, value)

    def __repr__(self) -> str:
        return f"<Check {self.allowed}>"


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def integer(
    minimum: int | None = None, maximum: int | None = None, *, allowed: str | None = None
) -> Check[int]:
    """An int (never a bool) within ``[minimum, maximum]`` (either bound may be None)."""
    low = -math.inf if minimum is None else minimum
    high = math.inf if maximum is None else maximum

    def within(value: Any) -> bool:
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        return low <= value <= high

    def at_least(value: Any) -> bool:  # the common case, without float comparisons
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        return value >= low

    if maximum is None and minimum is not None:
        return Check(at_least, allowed or f"an integer{_bounds(minimum, maximum)}")
    return Check(within, allowed or f"an integer{_bounds(minimum, maximum)}")


def number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: float | None = None,
    finite: bool = True,
    allowed: str | None = None,
) -> Check[float]:
    """An int or float (never a bool, never NaN), ``>= minimum``, ``> above``,
    ``<= maximum``; infinities only when ``finite`` is False."""

    def test(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return False
        if finite and not math.isfinite(value):
            return False
        if minimum is not None and value < minimum:
            return False
        if above is not None and value <= above:
            return False
        return maximum is None or value <= maximum

    text_ = allowed
    if text_ is None:
        parts = []
        if above is not None:
            parts.append(f"> {above}")
        if minimum is not None:
            parts.append(f">= {minimum}")
        if maximum is not None:
            parts.append(f"<= {maximum}")
        text_ = ("a finite number" if finite else "a number") + (
            " " + " and ".join(parts) if parts else ""
        )
    return Check(test, text_)


def fraction(*, zero: bool = False, one: bool = True, allowed: str | None = None) -> Check[float]:
    """A number between 0 and 1; ``zero``/``one`` say whether each end is allowed."""

    def test(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return (value >= 0 if zero else value > 0) and (value <= 1 if one else value < 1)

    interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
    return Check(test, allowed or f"a number in {interval}")


def flag() -> Check[bool]:
    """True or False (not 0, 1 or None)."""
    return Check(lambda value: isinstance(value, bool), "True or False")


def text(*, empty: bool = False, blank: bool = True, allowed: str | None = None) -> Check[str]:
    """A string, non-empty unless ``empty``; not only whitespace when ``blank`` is False."""

    def test(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        return (empty or bool(value)) and (blank or bool(value.strip()))

    default = "a string" if empty else "a non-empty string"
    return Check(test, allowed or (default if blank else default + " (not only whitespace)"))


def one_of(values: Sequence[T], *, allowed: str | None = None) -> Check[T]:
    """One of ``values`` (compared by equality; a bool never matches an int)."""
    choices = tuple(values)

    def test(value: Any) -> bool:
        return any(type(value) is type(c) and value == c for c in choices)

    return Check(test, allowed or "one of " + ", ".join(repr(c) for c in choices))


def each(
    item: Check[T],
    *,
    empty: bool = True,
    distinct: bool = False,
    allowed: str | None = None,
) -> Check[Sequence[T]]:
    """A collection (list, tuple, set, dict keys...; not a string, a mapping or a one-pass
    iterator) whose every item ``item`` allows; non-empty unless ``empty``; no item twice
    when ``distinct``."""

    def test(value: Any) -> bool:
        if isinstance(value, str | bytes | Mapping | Iterator) or not isinstance(value, Iterable):
            return False
        items = tuple(value)
        if not items and not empty:
            return False
        if not all(item.test(one) for one in items):
            return False
        return not distinct or _distinct(items)

    if allowed is None:
        allowed = "a " + ("" if empty else "non-empty ") + "collection"
        allowed += (" of distinct items" if distinct else " of items") + f", each {item.allowed}"
    return Check(test, allowed)


def _distinct(items: tuple[Any, ...]) -> bool:
    try:
        return len(set(items)) == len(items)
    except TypeError:  # unhashable items: compare pairwise
        return all(a != b for i, a in enumerate(items) for b in items[i + 1 :])


def implements(kind: type | tuple[type, ...], *, allowed: str | None = None) -> Check[Any]:
    """An instance of ``kind`` (a class, a tuple of them, or a ``runtime_checkable``
    protocol)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = " or ".join(k.__name__ for k in kinds)
    return Check(lambda value: isinstance(value, kind), allowed or f"an instance of {names}")


def function(*, allowed: str | None = None) -> Check[Callable[..., Any]]:
    """Anything callable."""
    return Check(callable, allowed or "a callable")


def optional(inner: Check[T], *, allowed: str | None = None) -> Check[T | None]:
    """None, or what ``inner`` allows."""
    return Check(
        lambda value: value is None or inner.test(value), allowed or f"{inner.allowed} or None"
    )
