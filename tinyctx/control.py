"""Control outcomes: how a tool, a layer or a nested call steers the agent loop.

A control outcome is a value, never an exception inside the onion: it is requested on the
run's :class:`ControlSlot`, drained at a safe checkpoint and applied by the loop, which is
outside every layer, so no layer's ``except Exception`` can swallow it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from attrs import frozen

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


@frozen
class Interrupt:
    """Pause at the next safe checkpoint so the caller can persist and resume later."""

    node: str
    message: str = ""
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
