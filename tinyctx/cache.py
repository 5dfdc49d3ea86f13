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
        self._namespaces: dict[str, dict[Any, Any]] = {}
        self._state: dict[int, tuple[object, Any]] = {}

    def namespace(self, name: str) -> MutableMapping[Any, Any]:
        """The dict for ``name``, created on first use."""
        space = self._namespaces.get(name)
        if space is None:
            space = self._namespaces[name] = {}
        return space

    def state_for(self, owner: object, factory: Callable[[], T]) -> T:
        """The state object of ``owner`` (a layer, usually) in this tree, made on first use.

        Keyed by identity; the owner is kept alive with its state so the key stays valid.
        """
        entry = self._state.get(id(owner))
        if entry is None or entry[0] is not owner:
            state = factory()
            self._state[id(owner)] = (owner, state)
            return state
        value: T = entry[1]
        return value

    def clear(self) -> None:
        self._namespaces.clear()
        self._state.clear()

    def __repr__(self) -> str:
        return f"<CacheRegistry namespaces={sorted(self._namespaces)} owners={len(self._state)}>"
