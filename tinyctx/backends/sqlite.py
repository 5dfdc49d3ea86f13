"""SqliteStore: the embedded default for data, notes and durable threads, one SQLite
file shared by any number of stores and processes."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel

from ..config import Check, integer, number
from ..lifecycle import check_store_ttl
from ..store_errors import StoreClosed, StoreSchemaError
from ..store_protocols import (
    Note,
    check_archive_retention,
    check_fence,
    check_lease,
    check_list_args,
    check_notes_limit,
    encode_json,
    note_texts,
)
from ..threads import (
    ArchivedRange,
    Lease,
    ThreadRecord,
    ThreadWrite,
    check_thread_id,
    validate_lease_request,
    validate_write,
)
from ..worker import WorkerThread, cancel_requested, keep_inherited, reset_after_fork
from ._sqlite_lifecycle import SqliteLifecycle
from ._sqlite_schema import (
    AUTOCHECKPOINT_PAGES,
    BUSY_SLICE,
    MIGRATIONS,
    SCHEMA_VERSION,
    Immediate,
    StoreConnection,
    busy,
    enable_wal,
    inline_mode,
    migrate,
    stored_version,
    thread_mode,
)
from ._sqlite_threads import (
    acquire_lease,
    append_notes_row,
    archived,
    delete_thread,
    erase_thread,
    list_threads,
    load_thread,
    note_from_row,
    purge_archive,
    release_lease,
    renew_lease,
    set_thread_ttl,
    sweep_expired,
    write_thread,
)

__all__ = ["SqliteStore", "SCHEMA_VERSION", "MIGRATIONS", "DEFAULT_CACHE_BYTES"]

T = TypeVar("T")


DEFAULT_CACHE_BYTES: Final = 64 << 20
"""``SqliteStore(cache_bytes=...)``: SQLite's page cache for the store's connection."""

_PATH: Final[Check[str]] = Check(
    lambda value: isinstance(value, (str, os.PathLike)) and bool(os.fspath(value)),
    "a file path (str or os.PathLike)",
)
_TIMEOUT: Final = number(above=0, finite=False, allowed="a number of seconds > 0")
_BYTES: Final = integer(minimum=0, allowed="an integer number of bytes >= 0")


INLINE_BYTES: Final = 64 << 10
"""The largest write (its documents, state and checkpoint, in characters) a SqliteStore
makes on the event loop; a larger one, and any compaction, runs on the store's thread."""

INLINE_PAGES: Final = AUTOCHECKPOINT_PAGES // 4
"""Once the writes made on the event loop may have added this many pages to the WAL, the
next write runs on the store's thread, whose commit checkpoints the WAL once it outgrew
SQLite's default of 1000 pages: the WAL stays near that size, as with every write there."""


def _inline_pages(change: ThreadWrite) -> int | None:
    """The WAL pages a write of ``change`` may add, when it may be made on the event loop
    (see :data:`INLINE_BYTES`; None: it may not): a leaf page per table written (messages,
    thread row, version log) and the pages its text fills, counted generously."""
    if change.compaction is not None:
        return None
    size = sum(map(len, change.append))
    for doc in (change.state, change.checkpoint):
        if type(doc) is str:
            size += len(doc)
    return 3 + size // 2048 if size <= INLINE_BYTES else None


class SqliteStore(SqliteLifecycle):
    """A :class:`Store` in one SQLite file: the embedded default for notes and data.

    - WAL journal (readers never wait for the writer), ``synchronous=NORMAL``.
    - One connection per store, used from the store's own thread (:class:`WorkerThread`) one
      operation at a time; nothing waits for the disk on the event loop. The exception is
      a small thread write at ``NORMAL`` (a step's messages and state, up to
      :data:`INLINE_BYTES`): its commit only copies a few KB into the OS's page cache, so
      it is made on the loop when the store's thread is idle and the file unlocked,
      saving the two thread hops that were most of a durable step; a locked file, a
      compaction, a larger write and every checkpoint of the WAL stay on the thread.
    - Writes that read-then-insert (note sequence numbers) run in ``BEGIN IMMEDIATE``
      transactions, and ``timeout`` is SQLite's busy timeout: many stores (or processes)
      on one file wait for each other instead of losing or duplicating notes.
    - Every call answers a cancellation at once: a cancelled caller's call is skipped if
      it has not started, else interrupted (rolled back) or, waiting for another writer's
      lock, given up within 0.05 s; a call that had finished still returns its value.
    - A schema version table; an older file is migrated on open, a newer one is refused
      with :class:`StoreSchemaError`.
    - Values are JSON (a value that is not raises ``TypeError`` before anything is
      written); notes carry a per-namespace ``seq`` from 1, a timestamp and JSON metadata.
    - A thread's message keeps its text content in a column of its own
      (:func:`~tinyctx.documents.split_document`), so a load reads the text as text; the
      documents read back unchanged (:class:`~tinyctx.documents.SplitDocuments`). Upgrade
      every process that shares a file together: a process of an older release that opened
      the file before the migration fails loudly on such a row (its decoder refuses the
      stored head) instead of reading a message without its text.
    - Memory: the connection's page cache (``cache_bytes``, 64 MiB by default, allocated
      as pages are read) bounds what the store keeps, however many threads it serves.
      ``mmap_bytes`` (0, off, by default) lets SQLite map up to that much of the file for
      reads: a connection's first read of a long thread is about a quarter faster, but
      every page it maps stays in the process's RSS (file-backed) until the map is full.
    - ``ttl``: seconds a thread lives after its last write (None: forever; a thread's own
      TTL, :func:`~tinyctx.retention.set_thread_ttl`, wins). An expired thread reads as
      absent at once (a write or lease finds no thread and removes it); schedule
      :func:`~tinyctx.retention.sweep_expired` to free the rows of the others.

    The file is opened lazily on first use (or with ``await store.open()`` /
    ``async with store:``); ``aclose()`` closes it for good.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        archive_retention: float | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        mmap_bytes: int = 0,
        ttl: float | None = None,
    ) -> None:
        _PATH.check(path, "path", "SqliteStore")
        _TIMEOUT.check(timeout, "timeout", "SqliteStore")
        _BYTES.check(cache_bytes, "cache_bytes", "SqliteStore")
        _BYTES.check(mmap_bytes, "mmap_bytes", "SqliteStore")
        self.path: str = os.fspath(path)
        self.timeout = float(timeout)
        self.cache_bytes = cache_bytes
        self.mmap_bytes = mmap_bytes
        self.archive_retention = check_archive_retention(archive_retention, "SqliteStore")
        self.ttl = check_store_ttl(ttl, "SqliteStore")
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._worker = WorkerThread(f"tinyctx-sqlite {self.path}")
        self._inline_pages = 0  # WAL pages written on the event loop since on the thread
        reset_after_fork(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._conn is not None else "unopened"
        return f"<SqliteStore {self.path!r} {state}>"

    # -- plumbing ------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # the store's own thread: waiting callers wait on the loop, not in the shared pool;
        # a cancelled caller's call is skipped, or interrupted and rolled back (WorkerThread)
        return await self._worker.run(lambda: self._call(fn), interrupt=self._interrupt)

    def _interrupt(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.interrupt()

    def _after_fork(self) -> None:
        # in a forked child: SQLite forbids using the parent's connection here, so the child
        # opens its own and leaves that one alone (closing it could checkpoint under the
        # parent's feet); the lock a parent's thread held at the fork is replaced
        self._lock = threading.Lock()
        if self._conn is not None:
            keep_inherited(self._conn)
            self._conn = None

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with self._lock:
                    if self._closed:
                        raise StoreClosed(f"{self!r} was closed")
                    conn = self._conn if self._conn is not None else self._connect()
                    thread_mode(conn)
                    return fn(conn)
            except sqlite3.OperationalError as exc:
                # busy: nothing was done (a write takes its lock first, a read reads only)
                if not busy(exc) or cancel_requested() or time.monotonic() >= deadline:
                    raise

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=BUSY_SLICE,
                isolation_level=None,
                check_same_thread=False,
                factory=StoreConnection,
            )
        except sqlite3.OperationalError as exc:  # SQLite's message names no file
            raise sqlite3.OperationalError(
                f"{exc}: {self.path!r} (does its directory exist, and may this process "
                "write there?)"
            ) from exc
        try:
            enable_wal(conn, self.timeout)
            conn.execute("PRAGMA synchronous=NORMAL")
            # SQLite walks a long thread's pages through its page cache (2 MB by default,
            # less than a 2000-message thread): a cache that holds the threads a process
            # serves saves re-reading them on every load (pages are allocated as used;
            # another connection's write invalidates them). Off by default, a memory map
            # would read pages without the copy, but every page it maps stays in the
            # process's RSS: it grew with the file, past the cache's bound (issue #32)
            conn.execute(f"PRAGMA mmap_size={self.mmap_bytes}")
            conn.execute(f"PRAGMA cache_size={-(self.cache_bytes // 1024)}")
            migrate(conn, self.path)
            conn.path = self.path
            (conn.schema_cookie,) = conn.execute("PRAGMA schema_version").fetchone()
        except sqlite3.OperationalError as exc:
            conn.close()  # cannot open the file, or busy past the timeout: as SQLite says
            raise sqlite3.OperationalError(f"{exc}: {self.path!r}") from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreSchemaError(f"{self.path}: not a tinyctx SQLite store ({exc})") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file now (and migrate it), instead of on first use."""
        await self._run(lambda conn: None)

    async def schema_version(self) -> int:
        """The schema version of the open file (always :data:`SCHEMA_VERSION` once open)."""
        return await self._run(stored_version)

    async def aclose(self) -> None:
        """Close the connection; later calls raise :class:`StoreClosed`. Idempotent."""

        def close() -> None:
            with self._lock:
                self._closed = True
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

        try:
            # shielded (a cancelled close would be skipped, leaving the file open); bounded
            # by the call ahead of it, which a busy file ends within ``timeout``
            with anyio.CancelScope(shield=True):
                await self._worker.run(close)
        finally:
            self._worker.stop()

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- key/value -----------------------------------------------------------------------

    async def get(self, namespace: str, key: str) -> Any | None:
        def get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT value FROM tinyctx_kv WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
            return None if row is None else str(row[0])

        raw = await self._run(get)
        return None if raw is None else json.loads(raw)

    async def put(self, namespace: str, key: str, value: Any) -> None:
        encoded = encode_json(value, f"the value of {namespace!r}/{key!r}", owner="SqliteStore")

        def put(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tinyctx_kv (namespace, key, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (namespace, key, encoded, time.time()),
            )

        await self._run(put)

    async def delete(self, namespace: str, key: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM tinyctx_kv WHERE namespace = ? AND key = ?", (namespace, key)
            )
            return cursor.rowcount > 0

        return await self._run(delete)

    async def keys(self, namespace: str) -> list[str]:
        def keys(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT key FROM tinyctx_kv WHERE namespace = ? ORDER BY key", (namespace,)
            ).fetchall()
            return [str(row[0]) for row in rows]

        return await self._run(keys)

    # -- notes ---------------------------------------------------------------------------

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        (note,) = await self.append_notes(namespace, (text,), metadata=metadata)
        return note

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> list[Note]:
        """Append every text with consecutive ``seq`` values in one transaction; with
        ``fence``, only while it is its thread's newest lease (else :class:`FencedOut`)."""
        items = note_texts(texts)
        check_fence(fence)
        if not items:
            return []
        meta = encode_json(metadata or {}, "note metadata", owner="SqliteStore")
        return await self._run(lambda conn: append_notes_row(conn, namespace, items, meta, fence))

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; with ``limit``, only the newest ``limit`` of them."""
        check_notes_limit(limit)
        if limit == 0:
            await anyio.lowlevel.checkpoint()
            return []

        def notes(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            columns = "SELECT seq, text, created_at, metadata FROM tinyctx_notes"
            if limit is None:
                query = f"{columns} WHERE namespace = ? ORDER BY seq"
                return conn.execute(query, (namespace,)).fetchall()
            query = f"{columns} WHERE namespace = ? ORDER BY seq DESC LIMIT ?"
            return conn.execute(query, (namespace, limit)).fetchall()[::-1]

        rows = await self._run(notes)
        return [note_from_row(namespace, row) for row in rows]

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace`` in one transaction; numbering starts again at 1."""

        def delete(conn: sqlite3.Connection) -> int:
            with Immediate(conn):
                cursor = conn.execute("DELETE FROM tinyctx_notes WHERE namespace = ?", (namespace,))
                return cursor.rowcount

        return await self._run(delete)

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now, from one snapshot; an unknown thread is empty at version 0."""
        check_thread_id(thread_id)
        return await self._run(lambda conn: load_thread(conn, thread_id, self.ttl))

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """Apply ``change`` in one ``BEGIN IMMEDIATE`` transaction; see
        :meth:`tinyctx.threads.ThreadStore.write`."""
        validate_write(thread_id, change, expected_version, lease)
        retention, ttl = self.archive_retention, self.ttl

        def write(conn: sqlite3.Connection) -> int:
            return write_thread(conn, thread_id, change, expected_version, lease, retention, ttl)

        await anyio.lowlevel.checkpoint_if_cancelled()
        pages = _inline_pages(change)
        if pages is not None:
            landed = self._write_inline(write)
            if landed is not None:
                self._inline_pages += pages
                return landed
        self._inline_pages = 0
        return await self._run(write)

    def _write_inline(self, write: Callable[[sqlite3.Connection], int]) -> int | None:
        """A small write made here, on the event loop, when nothing waits for the store's
        thread (so it overtakes no call), the connection is open and free, its sync mode
        waits for no disk at commit (NORMAL: a page-cache write of a few KB, cheaper than
        the hop to the thread and back) and the file's write lock is free; else None (the
        thread makes it, waiting for the lock as every call does). After
        :data:`INLINE_PAGES` the next write goes to the thread regardless: its commit folds
        a grown WAL back into the file, a wait for the disk the loop never makes."""
        if self._inline_pages >= INLINE_PAGES or not self._worker.idle:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            conn = self._conn
            if conn is None or self._closed or not inline_mode(conn):
                return None
            try:
                landed = write(conn)
            except sqlite3.OperationalError as exc:
                if busy(exc):  # another writer holds the file: nothing was done
                    return None
                raise
        finally:
            self._lock.release()
        return landed

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """A new lease with a fresh token; :class:`LeaseHeld` while another owner's is live."""
        validate_lease_request(thread_id, owner, ttl)
        return await self._run(
            lambda conn: acquire_lease(conn, thread_id, owner, float(ttl), self.ttl)
        )

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` (same token); :class:`FencedOut` if another lease replaced it."""
        check_lease(lease, "renew_lease")
        validate_lease_request(lease.thread_id, lease.owner, ttl)
        return await self._run(lambda conn: renew_lease(conn, lease, float(ttl), self.ttl))

    async def release_lease(self, lease: Lease) -> None:
        """Give the thread up; a no-op when ``lease`` was already replaced or released."""
        check_lease(lease, "release_lease")
        await self._run(lambda conn: release_lease(conn, lease))

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        """Ids of the threads written at least once, sorted, optionally by ``prefix``."""
        check_list_args(prefix, limit)
        return await self._run(lambda conn: list_threads(conn, prefix, limit, self.ttl))

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        """What compactions replaced on ``thread_id``, oldest first, within retention."""
        check_thread_id(thread_id)
        retention = self.archive_retention
        return await self._run(lambda conn: archived(conn, thread_id, retention, self.ttl))

    async def purge_archive(self) -> None:
        """Drop every archived range older than ``archive_retention`` (all threads) now.

        Writes that compact do this as they go; call it from a periodic job to bound the
        file when threads stop compacting.
        """
        retention = self.archive_retention

        def purge(conn: sqlite3.Connection) -> None:
            with Immediate(conn):
                purge_archive(conn, retention, time.time())

        await self._run(purge)

    async def delete_thread(self, thread_id: str) -> bool:
        """Remove the thread, its archive, checkpoint, state and lease; False if unknown."""
        check_thread_id(thread_id)
        return await self._run(lambda conn: delete_thread(conn, thread_id))

    async def erase_thread(self, thread_id: str) -> bool:
        """The thread, its labels and its thread notes, in one transaction; see
        :class:`tinyctx.lifecycle.ThreadEraseStore`."""
        check_thread_id(thread_id)
        return await self._run(lambda conn: erase_thread(conn, thread_id))

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        """The thread's own TTL from now (None: the store's; ``math.inf``: never); see
        :func:`tinyctx.retention.set_thread_ttl`."""
        check_thread_id(thread_id)
        return await self._run(lambda conn: set_thread_ttl(conn, thread_id, seconds, self.ttl))

    async def sweep_expired(self) -> list[str]:
        """Remove every expired thread whole, in one transaction; their ids, sorted."""
        return await self._run(lambda conn: sweep_expired(conn, self.ttl))
