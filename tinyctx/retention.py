"""Retention an application schedules: prune archived originals, delete a user's threads,
expire threads (a TTL per thread or per store).

``MemoryStore(ttl=86400)`` (every built-in store takes ``ttl=``) makes threads expire a
day after their last write; ``await set_thread_ttl(store, "t-1", 3600)`` gives one thread
its own (``math.inf``: never). An expired thread vanishes whole, with its labels and the
notes of its ``...:thread:<id>`` namespaces (:mod:`tinyctx.lifecycle` has the rules). Redis
expires the keys itself; SQL and memory stores treat an expired thread as absent at once
and free its space when ``await sweep_expired(store)`` runs (schedule it).

``await prune_archives(store, older_than=30 * 86400)`` drops, on every thread (or those
whose id starts with ``prefix``), the compacted originals archived more than 30 days
ago, through the store's :class:`~tinyctx.lifecycle.ArchivePruneStore` method (every
built-in store has it); run it from the application's scheduler (cron, a periodic task).
Versions before a pruned compaction can no longer be rebuilt
(:class:`~tinyctx.versions.VersionUnavailable`). ``archive_retention=`` on a store does
the same on every compaction of the thread it writes.

A thread labelled with :func:`set_thread_metadata` (``{"user_id": "u-1"}``) can be found
and erased by a label: ``await delete_threads_where(store, "user_id", "u-1")`` deletes
each such thread as expiry would: whole (messages, archive, versions, checkpoint, layer
state, lease), with its label and the notes of its ``...:thread:<id>`` namespaces, in one
step of the store (:meth:`~tinyctx.lifecycle.ThreadEraseStore.erase_thread`; every
built-in store has it). The labels live
in the store's key/value data (namespace :data:`THREAD_METADATA`), so every store that is
both a :class:`~tinyctx.store_protocols.Store` and a ThreadStore (every built-in one)
keeps them; a fork (:func:`~tinyctx.forks.fork_thread`) carries its source's labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .lifecycle import (
    THREAD_METADATA,
    ArchivePruneStore,
    ThreadEraseStore,
    ThreadExpiryStore,
    check_age,
    check_thread_ttl,
)
from .store_protocols import Store
from .threads import ThreadStore, check_thread_id

__all__ = [
    "THREAD_METADATA",
    "prune_archives",
    "set_thread_ttl",
    "sweep_expired",
    "set_thread_metadata",
    "thread_metadata",
    "erase_thread",
    "delete_threads_where",
]


def _expiry_store(store: object) -> ThreadExpiryStore:
    if not isinstance(store, ThreadExpiryStore):
        raise TypeError(f"{type(store).__name__} keeps no TTL (no set_thread_ttl)")
    return store


async def set_thread_ttl(store: ThreadStore, thread_id: str, seconds: float | None) -> bool:
    """Give ``thread_id`` its own TTL: seconds > 0 counted from its last write (the clock
    starts now, then again at each write), ``math.inf`` never to expire, None to follow
    the store's ``ttl=`` again (:mod:`tinyctx.lifecycle`). False when the thread does not
    exist (was never written, or expired)."""
    expiry = _expiry_store(store)
    check_thread_id(thread_id)
    return await expiry.set_thread_ttl(thread_id, check_thread_ttl(seconds))


async def sweep_expired(store: ThreadStore) -> list[str]:
    """Remove every expired thread of ``store`` whole (messages, archive, versions,
    checkpoint, state, lease, labels, the notes of its namespaces); their ids, sorted.
    Schedule it on SQL and memory stores (their reads already treat an expired thread as
    absent); on Redis, expiry is native and this finds nothing left to do."""
    return await _expiry_store(store).sweep_expired()


async def prune_archives(store: ThreadStore, *, older_than: float, prefix: str = "") -> int:
    """Prune every thread's archive (see the module docstring); how many ranges went."""
    check_age(older_than)
    if not isinstance(store, ArchivePruneStore):
        raise TypeError(f"{type(store).__name__} cannot prune its archive (no prune_archive)")
    removed = 0
    for thread_id in await store.list_threads(prefix=prefix):
        removed += await store.prune_archive(thread_id, older_than=older_than)
    return removed


def _labels_store(store: object) -> Any:
    if not isinstance(store, Store) or not isinstance(store, ThreadStore):
        raise TypeError(
            f"{type(store).__name__} must be both a Store and a ThreadStore to label threads"
        )
    return store


async def set_thread_metadata(store: Any, thread_id: str, metadata: Mapping[str, Any]) -> None:
    """Label ``thread_id`` with ``metadata`` (JSON values by str keys), replacing its
    labels; an empty mapping removes them."""
    labels = _labels_store(store)
    check_thread_id(thread_id)
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise TypeError(f"metadata must be a mapping with str keys, got {metadata!r}")
    if metadata:
        await labels.put(THREAD_METADATA, thread_id, dict(metadata))
    else:
        await labels.delete(THREAD_METADATA, thread_id)


async def thread_metadata(store: Any, thread_id: str) -> dict[str, Any]:
    """The labels of ``thread_id`` (empty when it has none)."""
    labels = _labels_store(store)
    check_thread_id(thread_id)
    value = await labels.get(THREAD_METADATA, thread_id)
    return dict(value) if isinstance(value, Mapping) else {}


async def erase_thread(store: Any, thread_id: str) -> bool:
    """Erase ``thread_id`` whole with its labels and the notes of its thread namespaces,
    in one step of a :class:`~tinyctx.lifecycle.ThreadEraseStore` (every built-in
    store); whether anything of it was there. A store without it (a third-party one)
    falls back to :meth:`~tinyctx.threads.ThreadStore.delete_thread` and then the label
    (the thread goes first, so a run cut short is finished by running it again), and the
    notes of its thread namespaces stay."""
    labels = _labels_store(store)
    check_thread_id(thread_id)
    if isinstance(labels, ThreadEraseStore):
        return bool(await labels.erase_thread(thread_id))
    found = await labels.delete_thread(thread_id)
    return bool(await labels.delete(THREAD_METADATA, thread_id) or found)


async def delete_threads_where(store: Any, key: str, value: Any) -> list[str]:
    """Delete every thread whose label ``key`` equals ``value`` (see the module
    docstring); the ids deleted, sorted. A run cut short is finished by running it again.

    Each thread goes through :func:`erase_thread` (a store without
    :class:`~tinyctx.lifecycle.ThreadEraseStore` keeps the notes of its thread
    namespaces)."""
    labels = _labels_store(store)
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty str, got {key!r}")
    deleted: list[str] = []
    for thread_id in await labels.keys(THREAD_METADATA):
        found = await labels.get(THREAD_METADATA, thread_id)
        if not isinstance(found, Mapping) or key not in found or found[key] != value:
            continue
        await erase_thread(labels, thread_id)
        deleted.append(thread_id)
    return sorted(deleted)
