"""MemoryStore: a process-local store of data, notes and durable threads (tests, demos,
one-process apps). Every thread operation is one synchronous step of the event loop."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel

from ..frozen import frozen_mapping, thaw
from ..lifecycle import (
    THREAD_METADATA,
    ThreadWindow,
    check_age,
    check_store_ttl,
    check_window_args,
    expires_at,
    thread_of_namespace,
    window_of,
)
from ..store_errors import StoreClosed
from ..store_protocols import (
    Note,
    check_archive_retention,
    check_fence,
    check_lease,
    check_list_args,
    check_notes_limit,
    note_texts,
)
from ..threads import (
    ArchivedRange,
    FencedOut,
    Lease,
    LeaseHeld,
    StaleThreadVersion,
    ThreadRecord,
    ThreadWrite,
    Unchanged,
    check_thread_id,
    check_write_range,
    validate_lease_request,
    validate_write,
)
from ..versions import ThreadVersion, layers_at

__all__ = ["MemoryStore"]


class _MemoryThread:
    __slots__ = (
        "archive",
        "checkpoint",
        "layers",
        "lease",
        "log",
        "messages",
        "state",
        "ttl",
        "version",
        "written_at",
    )

    def __init__(self) -> None:
        self.version = 0
        self.written_at = 0.0  # the last write (or TTL change): expiry counts from it
        self.ttl: float | None = None  # its own TTL (None: the store's)
        # what each write did: (version, at, appended, start, end, replaced, run id)
        self.log: list[tuple[int, float, int, int | None, int | None, int, str | None]] = []
        self.messages: list[str] = []
        self.checkpoint: str | None = None
        self.state: str | None = None
        self.lease: Lease | None = None
        self.archive: list[ArchivedRange] = []
        # the checkpoint and state each write set: (version, checkpoint set, it, state)
        self.layers: list[tuple[int, bool, str | None, str | None]] = []


class MemoryStore:
    """A process-local :class:`Store` and :class:`~tinyctx.threads.ThreadStore`.

    Values are deep-copied in and out, as a real store would; thread documents are
    strings (immutable). Every thread operation is one synchronous step after a
    checkpoint, so it is atomic for every task of the event loop. ``archive_retention``
    (seconds, None: forever) bounds how long compacted originals stay readable; ``ttl``
    (seconds, None: never) how long a thread lives after its last write
    (:mod:`tinyctx.lifecycle`: an expired thread reads as absent, and goes whole at once).
    """

    def __init__(self, *, archive_retention: float | None = None, ttl: float | None = None) -> None:
        self._data: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, list[Note]] = {}
        self._lock = anyio.Lock()
        self._threads: dict[str, _MemoryThread] = {}
        self._last_token = 0
        self._closed = False
        self.archive_retention = check_archive_retention(archive_retention, "MemoryStore")
        self.ttl = check_store_ttl(ttl, "MemoryStore")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MemoryStore {len(self._threads)} threads {state}>"

    async def _ready(self) -> None:
        """A checkpoint, then :class:`StoreClosed` once :meth:`aclose` ran (as every store)."""
        await anyio.lowlevel.checkpoint()
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"{self!r} was closed")

    async def get(self, namespace: str, key: str) -> Any | None:
        await self._ready()
        value = self._data.get(namespace, {}).get(key)
        return thaw(value) if value is not None else None

    async def put(self, namespace: str, key: str, value: Any) -> None:
        await self._ready()
        self._data.setdefault(namespace, {})[key] = frozen_mapping({"v": value})["v"]

    async def delete(self, namespace: str, key: str) -> bool:
        await self._ready()
        return self._data.get(namespace, {}).pop(key, None) is not None

    async def keys(self, namespace: str) -> list[str]:
        await self._ready()
        return sorted(self._data.get(namespace, {}))

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        (text,) = note_texts((text,))
        async with self._lock:
            self._check_open()
            notes = self._notes.setdefault(namespace, [])
            note = Note(namespace, len(notes) + 1, text, time.time(), frozen_mapping(metadata))
            notes.append(note)
            return note

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> list[Note]:
        """Append every text as a note with consecutive ``seq`` values, atomically; with
        ``fence``, only while it is its thread's newest lease (else :class:`FencedOut`)."""
        texts = note_texts(texts)
        check_fence(fence)
        meta = frozen_mapping(metadata)
        async with self._lock:
            self._check_open()
            if fence is not None:  # nothing awaits from the check to the append
                thread = self._live(fence.thread_id)
                current = thread.lease if thread is not None else None
                if current is None or current.token != fence.token:
                    token = None if current is None else current.token
                    raise FencedOut(fence.thread_id, fence.token, token)
            notes = self._notes.setdefault(namespace, [])
            now = time.time()
            added = [
                Note(namespace, len(notes) + offset, text, now, meta)
                for offset, text in enumerate(texts, start=1)
            ]
            notes.extend(added)
            return added

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        check_notes_limit(limit)
        await self._ready()
        notes = self._notes.get(namespace, [])
        if limit is None:
            return list(notes)
        return notes[-limit:] if limit else []

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace``; numbering starts again at 1."""
        async with self._lock:
            self._check_open()
            return len(self._notes.pop(namespace, []))

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now; an unknown thread is an empty record at version 0."""
        check_thread_id(thread_id)
        await self._ready()
        thread = self._live(thread_id)
        if thread is None:
            return ThreadRecord(thread_id, 0, ())
        return ThreadRecord(
            thread_id,
            thread.version,
            tuple(thread.messages),
            thread.checkpoint,
            thread.state,
            thread.lease,
        )

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """Apply ``change`` atomically; see :meth:`tinyctx.threads.ThreadStore.write`."""
        validate_write(thread_id, change, expected_version, lease)
        await self._ready()
        # from here to the end nothing awaits: the write is one step for the event loop
        thread = self._live(thread_id)
        current = thread.lease if thread is not None else None
        if lease is not None and (current is None or current.token != lease.token):
            raise FencedOut(thread_id, lease.token, None if current is None else current.token)
        version = thread.version if thread is not None else 0
        if version != expected_version:
            raise StaleThreadVersion(thread_id, expected_version, version)
        check_write_range(thread_id, change, len(thread.messages) if thread is not None else 0)
        if thread is None:
            thread = self._threads[thread_id] = _MemoryThread()
        now = time.time()
        thread.written_at = now
        new_version = version + 1
        compaction = change.compaction
        if compaction is not None:
            start, end = compaction.start, compaction.end
            if end > start:
                replaced = tuple(thread.messages[start:end])
                thread.archive.append(
                    ArchivedRange(thread_id, new_version, start, end, replaced, now)
                )
            thread.messages[start:end] = compaction.replacement
        thread.messages.extend(change.append)
        entry: tuple[int | None, int | None, int]
        if compaction is None:
            entry = (None, None, 0)
        else:
            entry = (compaction.start, compaction.end, len(compaction.replacement))
        thread.log.append((new_version, now, len(change.append), *entry, change.run_id))
        checkpoint_set = not isinstance(change.checkpoint, Unchanged)
        if checkpoint_set or not isinstance(change.state, Unchanged):
            checkpoint = change.checkpoint if isinstance(change.checkpoint, str) else None
            state = change.state if isinstance(change.state, str) else None
            thread.layers.append((new_version, checkpoint_set, checkpoint, state))
        if not isinstance(change.checkpoint, Unchanged):
            thread.checkpoint = change.checkpoint
        if not isinstance(change.state, Unchanged):
            thread.state = change.state
        thread.version = new_version
        self._purge_archive(thread, now)
        return new_version

    def _purge_archive(self, thread: _MemoryThread, now: float) -> None:
        retention = self.archive_retention
        if retention is not None and thread.archive:
            cutoff = now - retention
            thread.archive = [a for a in thread.archive if a.archived_at >= cutoff]

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """A new lease with a fresh token; :class:`LeaseHeld` while another owner's is live."""
        validate_lease_request(thread_id, owner, ttl)
        await self._ready()
        thread = self._live(thread_id)
        now = time.time()
        current = thread.lease if thread is not None else None
        if current is not None and current.owner != owner and current.expires_at > now:
            raise LeaseHeld(thread_id, current.owner, current.expires_at)
        if thread is None:
            thread = self._threads[thread_id] = _MemoryThread()
        self._last_token += 1
        lease = thread.lease = Lease(thread_id, owner, self._last_token, now + ttl)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` (same token); :class:`FencedOut` if another lease replaced it."""
        check_lease(lease, "renew_lease")
        validate_lease_request(lease.thread_id, lease.owner, ttl)
        await self._ready()
        thread = self._live(lease.thread_id)
        current = thread.lease if thread is not None else None
        if thread is None or current is None or current.token != lease.token:
            raise FencedOut(
                lease.thread_id, lease.token, None if current is None else current.token
            )
        renewed = thread.lease = Lease(
            lease.thread_id, current.owner, lease.token, time.time() + ttl
        )
        return renewed

    async def release_lease(self, lease: Lease) -> None:
        """Give the thread up; a no-op when ``lease`` was already replaced or released."""
        check_lease(lease, "release_lease")
        await self._ready()
        thread = self._live(lease.thread_id)
        if thread is None or thread.lease is None or thread.lease.token != lease.token:
            return
        thread.lease = None
        if thread.version == 0:
            del self._threads[lease.thread_id]  # a lease alone leaves nothing behind

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        """Ids of the threads written at least once, sorted, optionally by ``prefix``."""
        check_list_args(prefix, limit)
        await self._ready()
        ids = sorted(
            tid
            for tid in list(self._threads)
            if tid.startswith(prefix) and (t := self._live(tid)) is not None and t.version > 0
        )
        return ids if limit is None else ids[:limit]

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        """What compactions replaced on ``thread_id``, oldest first, within retention."""
        check_thread_id(thread_id)
        await self._ready()
        thread = self._live(thread_id)
        if thread is None:
            return []
        self._purge_archive(thread, time.time())
        return list(thread.archive)

    async def delete_thread(self, thread_id: str) -> bool:
        """Remove the thread, its archive, checkpoint, state and lease; False if unknown."""
        check_thread_id(thread_id)
        await self._ready()
        return self._threads.pop(thread_id, None) is not None

    # -- windows, versions, archive pruning (tinyctx.history) ------------------------

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` live messages before ``stop``; see
        :meth:`tinyctx.history.ThreadWindowStore.load_window`."""
        check_window_args(thread_id, stop, count)
        await self._ready()
        thread = self._live(thread_id)
        if thread is None:
            return ThreadWindow(thread_id, 0, 0, 0, ())
        return window_of(
            thread_id,
            thread.version,
            thread.messages,
            stop,
            count,
            thread.checkpoint,
            thread.state,
        )

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Drop archived ranges older than ``older_than`` seconds; how many."""
        check_thread_id(thread_id)
        cutoff = time.time() - check_age(older_than)
        await self._ready()
        thread = self._live(thread_id)
        if thread is None:
            return 0
        kept = [a for a in thread.archive if a.archived_at >= cutoff]
        removed = len(thread.archive) - len(kept)
        thread.archive = kept
        return removed

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """What each write did, oldest first; see :mod:`tinyctx.versions`."""
        check_thread_id(thread_id)
        await self._ready()
        thread = self._live(thread_id)
        return [] if thread is None else [ThreadVersion(*entry) for entry in thread.log]

    # -- expiry (tinyctx.lifecycle) -----------------------------------------------------

    def _live(self, thread_id: str) -> _MemoryThread | None:
        """The thread, unless it expired: then it goes whole, now (no await in here)."""
        thread = self._threads.get(thread_id)
        if thread is None or thread.version == 0:
            return thread
        if expires_at(thread.written_at, thread.ttl, self.ttl) > time.time():
            return thread
        self._expire(thread_id)
        return None

    def _expire(self, thread_id: str) -> bool:
        """Remove the thread whole, its labels and its namespaces' notes (expiry and
        :meth:`erase_thread`); whether anything of it was there."""
        found = self._threads.pop(thread_id, None) is not None
        found |= self._data.get(THREAD_METADATA, {}).pop(thread_id, None) is not None
        for namespace in [n for n in self._notes if thread_of_namespace(n) == thread_id]:
            del self._notes[namespace]
            found = True
        return found

    async def erase_thread(self, thread_id: str) -> bool:
        """The thread, its labels and its thread notes, at once; see
        :class:`tinyctx.lifecycle.ThreadEraseStore`."""
        check_thread_id(thread_id)
        await self._ready()
        return self._expire(thread_id)

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        """The thread's own TTL from now (None: the store's; ``math.inf``: never)."""
        check_thread_id(thread_id)
        await self._ready()
        thread = self._live(thread_id)
        if thread is None or thread.version == 0:
            return False
        thread.ttl = seconds
        thread.written_at = time.time()
        return True

    async def sweep_expired(self) -> list[str]:
        """Remove every expired thread whole; their ids, sorted."""
        await self._ready()
        return sorted(tid for tid in list(self._threads) if self._live(tid) is None)

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        """The checkpoint and state the thread had at ``version``; see
        :class:`tinyctx.versions.ThreadLayersStore`."""
        check_thread_id(thread_id)
        await self._ready()
        thread = self._live(thread_id)
        return layers_at(thread.layers if thread is not None else [], version)

    async def aclose(self) -> None:
        """Close the store: later calls raise :class:`StoreClosed`. Idempotent."""
        await anyio.lowlevel.checkpoint()
        self._closed = True
