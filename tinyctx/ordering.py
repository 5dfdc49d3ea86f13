"""Declared ordering between layers, checked when an agent is built.

A layer states where it must sit relative to others in its ``constraints`` (a tuple of the
rules below); ``Agent(...)`` checks every rule of every layer and refuses a stack that breaks
one with :class:`OrderingError`, naming both layers, their indices, the rule and an order
that satisfies every rule. A stack is never reordered silently.

- :class:`Outside` ``(target)``: this layer sits outside (at a lower index than) every layer
  matching ``target``, a layer name or class. ``required=True`` also demands one is present.
- :class:`Inside` ``(target)``: this layer sits inside every layer matching ``target``.
- :class:`Outermost` ``(hook)`` / :class:`Innermost` ``(hook)``: no other layer that
  implements ``hook`` (``"model"`` or ``"tool"``) sits outside / inside it.
- :class:`Once`: at most one layer of this class in the stack.

Observers that change nothing (a tracing or measuring layer) may set
``ordering_neutral = True``: other layers' rules then ignore them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from attrs import field, frozen

from .chain import Layer, LayerLike, has_hook, layer_name
from .config import Check, implements, one_of
from .errors import ConfigError

__all__ = [
    "Outside",
    "Inside",
    "Outermost",
    "Innermost",
    "Once",
    "Constraint",
    "OrderingError",
    "Violation",
    "check_ordering",
    "find_violations",
    "satisfying_order",
    "constraints_of",
    "check_constraints_consistent",
]

Target: TypeAlias = "str | type[Layer]"
Hook = Literal["model", "tool"]
_HOOKS = ("model", "tool")


def _is_target(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, type) and issubclass(value, Layer)


_check_target: Check[Target] = Check(_is_target, "a layer name (non-empty str) or a Layer class")
_check_hook = one_of(_HOOKS, allowed="'model' or 'tool'")


def _describe(target: Target) -> str:
    return target if isinstance(target, str) else target.__name__


@frozen
class Outside:
    """This layer must sit outside (before, at a lower index than) ``target``."""

    target: Target = field(validator=_check_target)
    reason: str = ""
    required: bool = False

    def describe(self) -> str:
        need = " (and it must be present)" if self.required else ""
        return f"must be outside {_describe(self.target)}{need}"


@frozen
class Inside:
    """This layer must sit inside (after, at a higher index than) ``target``."""

    target: Target = field(validator=_check_target)
    reason: str = ""
    required: bool = False

    def describe(self) -> str:
        need = " (and it must be present)" if self.required else ""
        return f"must be inside {_describe(self.target)}{need}"


@frozen
class Outermost:
    """No other layer implementing ``hook`` may sit outside this one."""

    hook: Hook = field(validator=_check_hook)
    reason: str = ""

    def describe(self) -> str:
        return f"must be the outermost {self.hook} layer"


@frozen
class Innermost:
    """No other layer implementing ``hook`` may sit inside this one."""

    hook: Hook = field(validator=_check_hook)
    reason: str = ""

    def describe(self) -> str:
        return f"must be the innermost {self.hook} layer"


@frozen
class Once:
    """At most one layer of this class may be in a stack."""

    reason: str = ""

    def describe(self) -> str:
        return "may appear only once"


Constraint: TypeAlias = "Outside | Inside | Outermost | Innermost | Once"
_CONSTRAINT_TYPES = (Outside, Inside, Outermost, Innermost, Once)
_CONSTRAINT = implements(
    _CONSTRAINT_TYPES, allowed="Outside, Inside, Outermost, Innermost or Once rules"
)


@frozen
class Violation:
    """One broken rule: ``layer`` (at ``index``) declared ``rule``; ``other`` breaks it."""

    rule: Outside | Inside | Outermost | Innermost | Once
    index: int
    layer: str
    other_index: int | None
    other: str | None

    def describe(self) -> str:
        where = f"{self.layer!r} (middleware[{self.index}]) {self.rule.describe()}"
        if self.other is None:
            return f"{where}, but no such layer is in the stack"
        return f"{where}, but {self.other!r} is at middleware[{self.other_index}]"


class OrderingError(ConfigError):
    """A stack breaks a layer's declared ordering rule; nothing was reordered."""

    def __init__(self, violation: Violation, suggestion: Sequence[str] | None) -> None:
        self.violation = violation
        self.suggestion = tuple(suggestion) if suggestion is not None else None
        reason = f" ({violation.rule.reason})" if violation.rule.reason else ""
        rule = violation.rule
        if isinstance(rule, Once):
            fix = "keep one of them: no order can satisfy this rule"
        elif violation.other is None and isinstance(rule, Outside | Inside):
            fix = f"add a {_describe(rule.target)} layer to the stack"
        elif self.suggestion is None:
            fix = "no order satisfies every declared rule: the layers' rules contradict"
        else:
            fix = "an order that satisfies every rule: [" + ", ".join(self.suggestion) + "]"
        where = f"middleware[{violation.index}]"
        super().__init__(where, violation.layer, violation.rule.describe(), owner="Agent")
        self.args = (f"Agent: {violation.describe()}{reason}; {fix}",)


def constraints_of(layer: LayerLike) -> tuple[Constraint, ...]:
    """The rules ``layer`` declares (its ``constraints`` attribute; none for a function)."""
    if not isinstance(layer, Layer):
        return ()
    declared = getattr(layer, "constraints", ())
    rules = tuple(declared)
    for rule in rules:
        _CONSTRAINT.check(rule, f"{layer_name(layer)}.constraints", type(layer).__name__)
    return rules


def _neutral(layer: LayerLike) -> bool:
    return isinstance(layer, Layer) and bool(getattr(layer, "ordering_neutral", False))


def _matches(layer: LayerLike, target: Target) -> bool:
    if isinstance(target, str):
        return layer_name(layer) == target
    return isinstance(layer, target)


def _edges(layers: Sequence[LayerLike]) -> list[tuple[int, int, Violation | None]]:
    """Every "a before b" the rules demand, with the violation when the stack breaks it."""
    edges: list[tuple[int, int, Violation | None]] = []
    names = [layer_name(layer) for layer in layers]

    def edge(before: int, after: int, owner: int, rule: Constraint) -> None:
        other = after if owner == before else before
        broken = None
        if before > after:
            broken = Violation(rule, owner, names[owner], other, names[other])
        edges.append((before, after, broken))

    for i, layer in enumerate(layers):
        for rule in constraints_of(layer):
            if isinstance(rule, Outside | Inside):
                for j, other in enumerate(layers):
                    if j == i or _neutral(other) or not _matches(other, rule.target):
                        continue
                    if isinstance(rule, Outside):
                        edge(i, j, i, rule)
                    else:
                        edge(j, i, i, rule)
            elif isinstance(rule, Outermost | Innermost):
                for j, other in enumerate(layers):
                    if j == i or _neutral(other) or not has_hook(other, rule.hook):
                        continue
                    if isinstance(rule, Outermost):
                        edge(i, j, i, rule)
                    else:
                        edge(j, i, i, rule)
    return edges


def find_violations(layers: Sequence[LayerLike]) -> list[Violation]:
    """Every declared rule ``layers`` break, in stack order (empty when none)."""
    found: list[Violation] = []
    names = [layer_name(layer) for layer in layers]
    for i, layer in enumerate(layers):
        for rule in constraints_of(layer):
            if isinstance(rule, Once):
                for j in range(i + 1, len(layers)):
                    if type(layers[j]) is type(layer):
                        found.append(Violation(rule, i, names[i], j, names[j]))
                        break
            elif (
                isinstance(rule, Outside | Inside)
                and rule.required
                and not any(_matches(o, rule.target) for j, o in enumerate(layers) if j != i)
            ):
                found.append(Violation(rule, i, names[i], None, None))
    found.extend(v for _, _, v in _edges(layers) if v is not None)
    # what no reordering can fix comes first: it is what the error must name
    found.sort(
        key=lambda v: (
            not (isinstance(v.rule, Once) or v.other is None),
            v.index,
            v.other_index or -1,
        )
    )
    return found


def satisfying_order(layers: Sequence[LayerLike]) -> list[str] | None:
    """Layer names in an order that keeps every "before" rule, as close to the given order
    as possible (a stable topological sort); None when the rules contradict each other."""
    n = len(layers)
    after: list[set[int]] = [set() for _ in range(n)]
    indegree = [0] * n
    for before, later, _ in _edges(layers):
        if later not in after[before]:
            after[before].add(later)
            indegree[later] += 1
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != n:
        return None
    return [layer_name(layers[i]) for i in order]


def check_ordering(layers: Sequence[LayerLike]) -> None:
    """Raise :class:`OrderingError` for the first broken rule; never reorders anything."""
    violations = find_violations(layers)
    if violations:
        # an order is suggested only when reordering alone can fix the stack
        unfixable = any(isinstance(v.rule, Once) or v.other is None for v in violations)
        first = violations[0]
        raise OrderingError(first, None if unfixable else satisfying_order(layers))


def check_constraints_consistent(layer: LayerLike) -> list[str]:
    """Contradictions within one layer's own rules (empty when consistent).

    A layer cannot be both outside and inside one target, nor the outermost and the
    innermost of one hook, and a rule naming the layer itself can never hold.
    """
    problems: list[str] = []
    rules = constraints_of(layer)
    own = layer_name(layer)
    outside = {_describe(r.target) for r in rules if isinstance(r, Outside)}
    inside = {_describe(r.target) for r in rules if isinstance(r, Inside)}
    for target in sorted(outside & inside):
        problems.append(f"{own!r} must be both outside and inside {target!r}")
    for target in sorted(outside | inside):
        if target in (own, type(layer).__name__):
            problems.append(f"{own!r} declares a rule about itself ({target!r})")
    outer = {r.hook for r in rules if isinstance(r, Outermost)}
    inner = {r.hook for r in rules if isinstance(r, Innermost)}
    for hook in sorted(outer & inner):
        problems.append(f"{own!r} must be both the outermost and innermost {hook} layer")
    for rule in rules:
        if isinstance(rule, Outermost | Innermost) and not has_hook(layer, rule.hook):
            problems.append(
                f"{own!r} declares {rule.describe()} but does not implement the {rule.hook} hook"
            )
    return problems
