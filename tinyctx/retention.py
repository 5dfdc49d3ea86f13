"""Retention an application schedules: prune archived originals, delete a user's threads.

``await prune_archives(store, older_than=30 * 86400)`` drops, on every thread (or those
whose id starts with ``prefix``), the compacted originals archived more than 30 days
ago, through the store's :class:`~tinyctx.lifecycle.ArchivePruneStore` method (every
built-in store has it); run it from the application's scheduler (cron, a periodic task).
Versions before a pruned compaction can no longer be rebuilt
(:class:`~tinyctx.versions.VersionUnavailable`). ``archive_retention=`` on a store does
the same on every compaction of the thread it writes.

A thread labelled with :func:`set_thread_metadata` (``{"user_id": "u-1"}``) can be found
and erased by a label: ``await delete_threads_where(store, "user_id", "u-1")`` deletes
each such thread whole (messages, archive, versions, checkpoint, layer state, lease:
:meth:`~tinyctx.threads.ThreadStore.delete_thread`) and then its label. The labels live
in the store's key/value data (namespace :data:`THREAD_METADATA`), so every store that is
both a :class:`~tinyctx.store_protocols.Store` and a ThreadStore (every built-in one)
keeps them; a fork (:func:`~tinyctx.forks.fork_thread`) carries its source's labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .lifecycle import ArchivePruneStore, check_age
from .store_protocols import Store
from .threads import ThreadStore, check_thread_id

__all__ = [
    "THREAD_METADATA",
    "prune_archives",
    "set_thread_metadata",
    "thread_metadata",
    "delete_threads_where",
]

THREAD_METADATA: Final = "tinyctx.thread_metadata"
"""The key/value namespace holding each labelled thread's metadata (key: the thread id)."""


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


async def delete_threads_where(store: Any, key: str, value: Any) -> list[str]:
    """Delete every thread whose label ``key`` equals ``value`` (see the module
    docstring); the ids deleted, sorted. Each thread goes before its label, so a run cut
    short is finished by running it again."""
    labels = _labels_store(store)
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty str, got {key!r}")
    deleted: list[str] = []
    for thread_id in await labels.keys(THREAD_METADATA):
        found = await labels.get(THREAD_METADATA, thread_id)
        if not isinstance(found, Mapping) or key not in found or found[key] != value:
            continue
        await labels.delete_thread(thread_id)
        await labels.delete(THREAD_METADATA, thread_id)
        deleted.append(thread_id)
    return sorted(deleted)
