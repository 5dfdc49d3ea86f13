"""Retention an application schedules: prune archived originals older than an age.

``await prune_archives(store, older_than=30 * 86400)`` drops, on every thread (or those
whose id starts with ``prefix``), the compacted originals archived more than 30 days
ago, through the store's :class:`~tinyctx.lifecycle.ArchivePruneStore` method (every
built-in store has it); run it from the application's scheduler (cron, a periodic task).
Versions before a pruned compaction can no longer be rebuilt
(:class:`~tinyctx.versions.VersionUnavailable`). ``archive_retention=`` on a store does
the same on every compaction of the thread it writes.
"""

from __future__ import annotations

from .lifecycle import ArchivePruneStore, check_age
from .threads import ThreadStore

__all__ = ["prune_archives"]


async def prune_archives(store: ThreadStore, *, older_than: float, prefix: str = "") -> int:
    """Prune every thread's archive (see the module docstring); how many ranges went."""
    check_age(older_than)
    if not isinstance(store, ArchivePruneStore):
        raise TypeError(f"{type(store).__name__} cannot prune its archive (no prune_archive)")
    removed = 0
    for thread_id in await store.list_threads(prefix=prefix):
        removed += await store.prune_archive(thread_id, older_than=older_than)
    return removed
