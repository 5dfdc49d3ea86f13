"""Control outcomes: how a tool, a layer or a nested call steers the agent loop.

A control outcome is a value, never an exception inside the onion: it is requested on the
run's :class:`ControlSlot`, drained at a safe checkpoint and applied by the loop, which is
outside every layer, so no layer's ``except Exception`` can swallow it.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from attrs import field, frozen

from .errors import a_type
from .frozen import (
    EMPTY,
    HUGE_INT,
    SPLIT_PAIR,
    FrozenDict,
    NestingError,
    freeze,
    text_fits,
    value_fits,
)

if TYPE_CHECKING:
    from .decisions import Decision

__all__ = [
    "Control",
    "StopWithFinal",
    "Interrupt",
    "ControlSlot",
    "Suspend",
    "Resumption",
    "resumption",
    "stronger",
]


def _text(instance: Any, attribute: Any, value: Any) -> None:
    """A control outcome's text field is a ``str`` (it is the run's answer, or stored with
    the checkpoint): anything else is refused where the outcome is built."""
    if not isinstance(value, str):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str, got {a_type(type(value))}"
        )
    if not text_fits(value):
        raise ValueError(f"{type(instance).__name__}.{attribute.name} {SPLIT_PAIR}")


@frozen
class StopWithFinal:
    """Stop the loop now; ``text`` (a ``str``) becomes the run's final answer."""

    text: str = field(validator=_text)
    kind: ClassVar[Literal["stop_with_final"]] = "stop_with_final"
    precedence: ClassVar[int] = 1

    @property
    def detail(self) -> str:
        return self.text


def _frozen_json(value: Any, owner: str, name: str, depth: int = 0) -> Any:
    """Deep-freeze ``value`` and check it is JSON data (so a store can keep the checkpoint;
    ``depth``: the levels of objects the checkpoint keeps it under)."""
    try:
        frozen_value = freeze(value, depth)
    except NestingError as exc:
        raise NestingError(f"{owner}.{name}: {exc}") from None
    problem = _json_problem(frozen_value, name)
    if problem is not None:
        raise TypeError(f"{owner}.{problem}")
    return frozen_value


def _json_payload(value: Any) -> Any:
    return _frozen_json(value, "Interrupt", "payload")


def _json_problem(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return None if text_fits(value) else f"{path} {SPLIT_PAIR}"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value_fits(value) else f"{path} {HUGE_INT}"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} must be a finite number, got {value!r}"
    if isinstance(value, FrozenDict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} keys must be strings, got {key!r}"
            if not text_fits(key):
                return f"{path} key {key!r} {SPLIT_PAIR}"
            problem = _json_problem(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, tuple):
        for index, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    return (
        f"{path} must be JSON data (objects, arrays, strings, numbers, booleans, null), "
        f"got {type(value).__name__}"
    )


@frozen
class Interrupt:
    """Pause at the next safe checkpoint so the caller can persist and resume later.

    ``payload`` is optional structured data for whoever handles the pause (a review UI:
    the calls to review); it must be JSON data and is stored deep-frozen, so it travels
    with the checkpoint through any store. ``node`` and ``message`` (each a ``str``) and
    ``payload`` are checked when the Interrupt is built: a value no store could
    read back (a number as the node, NaN, an integer past the digits Python converts,
    nesting past :data:`~tinyctx.codec.MAX_NESTING`) is an error there, never a checkpoint
    that bricks the thread.
    """

    node: str = field(validator=_text)
    message: str = field(default="", validator=_text)
    payload: Any = field(default=None, converter=_json_payload)
    kind: ClassVar[Literal["interrupt"]] = "interrupt"
    precedence: ClassVar[int] = 2

    @property
    def detail(self) -> str:
        return f"{self.node}: {self.message}" if self.message else self.node


Control = StopWithFinal | Interrupt


class Suspend(BaseException):
    """Raised by a tool (its handler, or a tool layer) to pause the run *at its call*.

    Unlike an :class:`Interrupt` requested on the control slot, which pauses after the call
    has its result, a suspended call gets no result: the run pauses with it and the calls
    after it pending (``Interrupted`` carries ``node``, ``message`` and ``payload``), and a
    resume runs it again. That run of the call sees :func:`tinyctx.control.resumption`: the
    ``state`` given here (JSON data, kept in the checkpoint through any store) and the
    decisions the resume was given, which the tool's ``check_resume`` accepted first. A
    sub-agent whose own run paused suspends the call that runs it this way.

    A ``BaseException``, like a cancellation: a layer's ``except Exception`` cannot
    swallow it, and a layer's ``finally`` still runs.
    """

    def __init__(
        self, node: str, message: str = "", *, payload: Any = None, state: Any = None
    ) -> None:
        if not isinstance(node, str) or not node:
            raise TypeError(f"Suspend.node must be a non-empty string, got {node!r}")
        try:
            self.interrupt = Interrupt(node, message, payload)
        except (TypeError, ValueError) as exc:  # named as the caller wrote it
            raise type(exc)(str(exc).replace("Interrupt.", "Suspend.", 1)) from None
        # the checkpoint keeps it two objects down its state: {"tinyctx:suspended": {"state"}}
        self.state = _frozen_json(state, "Suspend", "state", depth=2)
        super().__init__(self.interrupt.detail)

    @property
    def node(self) -> str:
        return self.interrupt.node


def stronger(current: Control | None, new: Control | None) -> Control | None:
    """The outcome that wins: strictly higher precedence replaces, a tie keeps ``current``."""
    if new is None:
        return current
    if current is None or new.precedence > current.precedence:
        return new
    return current


class ControlSlot:
    """The one pending control request of a run, shared with the contexts derived inside it.

    A pause is never silently downgraded to a stop: Interrupt (2) outranks StopWithFinal (1),
    and between equals the first request wins.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: Control | None = None

    def __repr__(self) -> str:
        return f"<ControlSlot pending={self._pending!r}>"

    def request(self, control: Control) -> None:
        if not isinstance(control, (StopWithFinal, Interrupt)):
            raise TypeError(
                f"control must be StopWithFinal or Interrupt, got {type(control).__name__}"
            )
        self._pending = stronger(self._pending, control)

    def take(self) -> Control | None:
        """Return the pending request and clear the slot."""
        pending, self._pending = self._pending, None
        return pending

    def peek(self) -> Control | None:
        return self._pending

    @property
    def pending(self) -> bool:
        return self._pending is not None


@frozen
class Resumption:
    """What a suspended tool call resumes with (see :class:`Suspend`): the ``state`` it
    gave when it suspended, and the decisions the resume was given for it."""

    state: Any
    decisions: FrozenDict[str, Decision] = EMPTY


class _OutsideToolCalls:
    """The value of ``RESUMING`` outside every tool call the loop runs."""


_OUTSIDE: Final = _OutsideToolCalls()

# set by the loop around each tool call: the resumption of the call it runs, else None (a
# nested run's calls set their own, so a sub-agent's tools never see their parent's)
RESUMING: ContextVar[Resumption | _OutsideToolCalls | None] = ContextVar(
    "tinyctx_resuming", default=_OUTSIDE
)


def resumption() -> Resumption | None:
    """Inside a tool call the run had suspended (:class:`Suspend`), its state and the
    resume's decisions; None in any other call, and outside tool calls."""
    value = RESUMING.get()
    return None if isinstance(value, _OutsideToolCalls) else value


def in_tool_call() -> bool:
    """Whether the caller runs inside a tool call of a run (where :class:`Suspend` may be
    raised: the loop catches it there, and nowhere else)."""
    return RESUMING.get() is not _OUTSIDE
