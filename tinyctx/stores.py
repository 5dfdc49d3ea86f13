"""Stores: namespaced key/value data and append-only notes that outlive a session.

A :class:`Store` is what a layer or tool writes to when something must survive the run
(session-memory notes, caches keyed by thread or user). A :class:`StoreRegistry` names
the stores a context carries; it is shared by every derived context.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import anyio
from attrs import field, frozen

from .frozen import EMPTY, FrozenDict, frozen_mapping, thaw

__all__ = ["Store", "Note", "StoreRegistry", "MemoryStore"]


@frozen
class Note:
    """One append-only note: ``seq`` orders notes within a namespace."""

    namespace: str
    seq: int
    text: str
    created_at: float
    metadata: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)


@runtime_checkable
class Store(Protocol):
    """Namespaced key/value data plus append-only, timestamped notes."""

    async def get(self, namespace: str, key: str) -> Any | None: ...

    async def put(self, namespace: str, key: str, value: Any) -> None: ...

    async def delete(self, namespace: str, key: str) -> bool: ...

    async def keys(self, namespace: str) -> list[str]: ...

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note: ...

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """A process-local store; values are deep-copied in and out, as a real store would."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, list[Note]] = {}
        self._lock = anyio.Lock()

    async def get(self, namespace: str, key: str) -> Any | None:
        await anyio.lowlevel.checkpoint()
        value = self._data.get(namespace, {}).get(key)
        return thaw(value) if value is not None else None

    async def put(self, namespace: str, key: str, value: Any) -> None:
        await anyio.lowlevel.checkpoint()
        self._data.setdefault(namespace, {})[key] = frozen_mapping({"v": value})["v"]

    async def delete(self, namespace: str, key: str) -> bool:
        await anyio.lowlevel.checkpoint()
        return self._data.get(namespace, {}).pop(key, None) is not None

    async def keys(self, namespace: str) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return sorted(self._data.get(namespace, {}))

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        async with self._lock:
            notes = self._notes.setdefault(namespace, [])
            note = Note(namespace, len(notes) + 1, text, time.time(), frozen_mapping(metadata))
            notes.append(note)
            return note

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        await anyio.lowlevel.checkpoint()
        notes = self._notes.get(namespace, [])
        return list(notes[-limit:] if limit else notes)

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()


class StoreRegistry(Mapping[str, Store]):
    """The named stores a context carries (read-only once built)."""

    __slots__ = ("_stores",)

    def __init__(self, stores: Mapping[str, Store] | None = None) -> None:
        self._stores: dict[str, Store] = {}
        for name, store in (stores or {}).items():
            if not isinstance(store, Store):
                raise TypeError(
                    f"stores[{name!r}] does not implement the tinyctx.stores.Store protocol"
                )
            self._stores[name] = store

    def __getitem__(self, name: str) -> Store:
        try:
            return self._stores[name]
        except KeyError:
            known = ", ".join(sorted(self._stores)) or "none"
            raise KeyError(f"no store named {name!r} in this context (known: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    def __repr__(self) -> str:
        return f"<StoreRegistry {sorted(self._stores)}>"

    def with_store(self, name: str, store: Store) -> StoreRegistry:
        """A new registry that also has ``store`` under ``name``."""
        return StoreRegistry({**self._stores, name: store})
