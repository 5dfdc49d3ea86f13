"""A namespaced in-process cache shared by a tree of nested calls.

Layers are shared by every session of an agent, so per-session layer state cannot live on
the layer. It lives here instead, keyed by the layer object: ``ctx.state_for(self, factory)``.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

__all__ = ["CacheRegistry"]

T = TypeVar("T")


class CacheRegistry:
    """Namespaces of plain dicts, plus per-owner state objects."""

    __slots__ = ("_namespaces", "_state")

    def __init__(self) -> None:
        # both made on first use: most trees never cache anything
        self._namespaces: dict[str, dict[Any, Any]] | None = None
        self._state: dict[int, tuple[object, Any]] | None = None

    def namespace(self, name: str) -> MutableMapping[Any, Any]:
        """The dict for ``name``, created on first use."""
        namespaces = self._namespaces
        if namespaces is None:
            namespaces = self._namespaces = {}
        space = namespaces.get(name)
        if space is None:
            space = namespaces[name] = {}
        return space

    def state_for(self, owner: object, factory: Callable[[], T]) -> T:
        """The state object of ``owner`` (a layer, usually) in this tree, made on first use.

        Keyed by identity; the owner is kept alive with its state so the key stays valid.
        """
        states = self._state
        if states is None:
            states = self._state = {}
        entry = states.get(id(owner))
        if entry is None or entry[0] is not owner:
            state = factory()
            states[id(owner)] = (owner, state)
            return state
        value: T = entry[1]
        return value

    def clear(self) -> None:
        self._namespaces = self._state = None

    def __repr__(self) -> str:
        names, owners = sorted(self._namespaces or ()), len(self._state or ())
        return f"<CacheRegistry namespaces={names} owners={owners}>"
