"""When a compaction layer acts, and how much of the history it keeps.

A :class:`Trigger` is a set of clauses — OR across clauses, AND within one — on the
request's token estimate (``tokens``), its share of the usable window (``fraction``) and its
message count (``messages``); it fires when the request reaches every threshold of at least
one clause. :func:`trigger` reads the spellings users bring:

- ``8000`` (tokens), ``0.8`` (a fraction of the usable window);
- LangChain's ``("tokens", 8000)``, ``("fraction", 0.8)``, ``("messages", 50)``;
- a mapping for AND: ``{"tokens": 8000, "messages": 50}``;
- a list for OR: ``[("fraction", 0.8), ("messages", 200)]``;
- ``Trigger`` values combined with ``&`` and ``|``.

A :class:`Keep` says how much of the newest history stays verbatim: ``("messages", 20)``,
``("tokens", 4000)`` or ``("fraction", 0.3)`` of the usable window; an int is messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import frozen

from tinyctx import ConfigError
from tinyctx.config import fraction, integer, one_of

__all__ = ["Trigger", "Keep", "trigger", "keep", "KINDS", "acts_on", "fits_after"]

KINDS = ("tokens", "fraction", "messages")
Kind = Literal["tokens", "fraction", "messages"]
Clause = tuple[tuple[str, float], ...]


def _value(kind: str, value: Any, field: str, owner: str) -> float:
    if kind == "fraction":
        return float(_FRACTION.check(value, f"{field}.fraction", owner))
    one_of(KINDS, allowed=f"a clause kind out of {KINDS}").check(kind, field, owner)
    return _POSITIVE.check(value, f"{field}.{kind}", owner)


_FRACTION = fraction()
_POSITIVE = integer(minimum=1)
_IS_INT = integer()


@frozen
class Trigger:
    """Clauses (OR) of thresholds (AND): see the module doc. Build with :func:`trigger`."""

    clauses: tuple[Clause, ...]

    def __or__(self, other: Trigger) -> Trigger:
        return Trigger(self.clauses + other.clauses)

    def __and__(self, other: Trigger) -> Trigger:
        return Trigger(tuple(a + b for a in self.clauses for b in other.clauses))

    @property
    def needs_window(self) -> bool:
        return any(kind == "fraction" for clause in self.clauses for kind, _ in clause)

    def fires(self, tokens: int, messages: int, usable: int | None, owner: str = "") -> bool:
        """Whether a request of ``tokens`` and ``messages`` reaches a clause; a fraction
        needs the usable window (a ConfigError naming the trigger when it is unknown)."""
        for clause in self.clauses:
            for kind, value in clause:
                if kind == "tokens" and tokens < value:
                    break
                if kind == "messages" and messages < value:
                    break
                if kind == "fraction":
                    if usable is None:
                        raise ConfigError(
                            "trigger",
                            self.describe(),
                            "a fraction of the window only with RunConfig.max_tokens set; "
                            "or give tokens",
                            owner=owner,
                        )
                    if tokens < max(1, math.floor(value * usable)):
                        break
            else:
                return True
        return False

    def describe(self) -> str:
        return " or ".join(
            " and ".join(f"{kind}>={value:g}" for kind, value in clause) for clause in self.clauses
        )


def _clause(value: Any, field: str, owner: str) -> Clause:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        kind, threshold = value
        if kind not in KINDS:
            raise ConfigError(field, value, f"a clause kind out of {KINDS}", owner=owner)
        return ((kind, _value(kind, threshold, field, owner)),)
    if isinstance(value, Mapping):
        if not value:
            raise ConfigError(field, value, f"at least one of {KINDS}", owner=owner)
        return tuple(
            (str(kind), _value(str(kind), threshold, field, owner))
            for kind, threshold in value.items()
        )
    if isinstance(value, float):
        return (("fraction", _value("fraction", value, field, owner)),)
    if _IS_INT.test(value):
        return (("tokens", _value("tokens", value, field, owner)),)
    raise ConfigError(
        field,
        value,
        "tokens (int), a fraction (float), ('tokens'|'fraction'|'messages', n), a mapping of "
        "them (AND), a list of those (OR), or a Trigger",
        owner=owner,
    )


def trigger(value: Any, *, field: str = "trigger", owner: str = "") -> Trigger:
    """A :class:`Trigger` from any spelling of the module doc (ConfigError naming ``field``)."""
    if isinstance(value, Trigger):
        return value
    if isinstance(value, list):
        if not value:
            raise ConfigError(field, value, "a non-empty list of clauses (OR)", owner=owner)
        return Trigger(tuple(_clause(item, f"{field}[{i}]", owner) for i, item in enumerate(value)))
    return Trigger((_clause(value, field, owner),))


def acts_on(
    when: Trigger | None, tokens: int, messages: int, usable: int | None, owner: str = ""
) -> bool:
    """Whether a layer whose trigger is ``when`` acts on a request of ``tokens`` and
    ``messages``: as the trigger says; with no trigger, only when the request would not fit
    the usable window ``usable`` (so on a conversation that fits the layer never rewrites a
    cached prompt prefix), and on every request when the window is unknown."""
    if when is not None:
        return when.fires(tokens, messages, usable, owner)
    return usable is None or tokens > usable


def fits_after(tokens_after: int, usable: int | None) -> bool:
    """Whether a rewrite that leaves a request at ``tokens_after`` is worth its broken cached
    prefix when a layer acts alone: the request then fits the usable window ``usable`` (or
    the window is unknown). A rewrite that leaves the request over the window buys nothing
    for this call, which overflows either way, and the rewrite a later call needs covers
    it (a layer's rewrites grow with the history), so holding it back until it makes the
    request fit batches the edits into one break of the prefix (DESIGN rule 11)."""
    return usable is None or tokens_after <= usable


@frozen
class Keep:
    """How much of the newest history a summary keeps verbatim."""

    kind: Kind
    value: float

    def tail_tokens(self, usable: int | None, owner: str = "") -> int | None:
        """The token budget of the kept tail, or None when it is counted in messages."""
        if self.kind == "messages":
            return None
        if self.kind == "tokens":
            return int(self.value)
        if usable is None:
            raise ConfigError(
                "keep",
                ("fraction", self.value),
                "a fraction of the window only with RunConfig.max_tokens set",
                owner=owner,
            )
        return max(1, math.floor(self.value * usable))


_KEEP = integer(minimum=0, allowed="an integer >= 0 (messages)")


def keep(value: Any, *, field: str = "keep", owner: str = "") -> Keep:
    """A :class:`Keep` from an int (messages) or ``(kind, value)`` (ConfigError naming
    ``field``)."""
    if isinstance(value, Keep):
        return value
    if _IS_INT.test(value):
        _KEEP.check(value, field, owner)
        return Keep("messages", value)
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and value[0] in KINDS
    ):
        kind, amount = value
        return Keep(kind, _value(kind, amount, field, owner))
    raise ConfigError(
        field,
        value,
        "messages (int) or ('messages'|'tokens'|'fraction', n)",
        owner=owner,
    )
