"""Control outcomes: how a tool, a layer or a nested call steers the agent loop.

A control outcome is a value, never an exception inside the onion: it is requested on the
run's :class:`ControlSlot`, drained at a safe checkpoint and applied by the loop, which is
outside every layer, so no layer's ``except Exception`` can swallow it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from attrs import field, frozen

from .frozen import FrozenDict, freeze

__all__ = ["Control", "StopWithFinal", "Interrupt", "ControlSlot", "stronger"]


@frozen
class StopWithFinal:
    """Stop the loop now; ``text`` becomes the run's final answer."""

    text: str
    kind: ClassVar[Literal["stop_with_final"]] = "stop_with_final"
    precedence: ClassVar[int] = 1

    @property
    def detail(self) -> str:
        return self.text


def _json_payload(value: Any) -> Any:
    """Deep-freeze ``value`` and check it is JSON data (so a store can keep the checkpoint)."""
    frozen_value = freeze(value)
    problem = _json_problem(frozen_value, "payload")
    if problem is not None:
        raise TypeError(f"Interrupt.{problem}")
    return frozen_value


def _json_problem(value: Any, path: str) -> str | None:
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} must be a finite number, got {value!r}"
    if isinstance(value, FrozenDict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} keys must be strings, got {key!r}"
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
    with the checkpoint through any store.
    """

    node: str
    message: str = ""
    payload: Any = field(default=None, converter=_json_payload)
    kind: ClassVar[Literal["interrupt"]] = "interrupt"
    precedence: ClassVar[int] = 2

    @property
    def detail(self) -> str:
        return f"{self.node}: {self.message}" if self.message else self.node


Control = StopWithFinal | Interrupt


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
