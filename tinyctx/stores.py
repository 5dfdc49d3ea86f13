"""Stores: namespaced key/value data and append-only notes that outlive a session.

A :class:`Store` is what a layer or tool writes to when something must survive the run
(session-memory notes, caches keyed by thread or user). A :class:`StoreRegistry` names
the stores a context carries; it is shared by every derived context.

:class:`MemoryStore` lives in the process; :class:`SqliteStore` is the embedded default
for anything that must survive a restart (one file, WAL, a versioned schema migrated on
open). Both also implement :class:`NoteBatchStore`: several notes appended atomically.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

import anyio
from attrs import field, frozen

from ._gc import gc_paused
from ._lifecycle_local import MemoryLifecycle, SqliteLifecycle
from .documents import SplitDocuments, join_document, split_document
from .errors import ConfigError, TinyCtxError
from .frozen import EMPTY, FrozenDict, frozen_mapping, thaw
from .messages import valid_text
from .threads import (
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
from .worker import WorkerThread, cancel_requested, keep_inherited, reset_after_fork

__all__ = [
    "Store",
    "Note",
    "StoreRegistry",
    "MemoryStore",
    "NoteBatchStore",
    "NoteDeleteStore",
    "append_notes",
    "check_fence",
    "SqliteStore",
    "StoreError",
    "StoreSchemaError",
    "StoreClosed",
    "StoreAuthenticationFailed",
    "StoreUnavailable",
    "WriteOutcomeUnknown",
]

T = TypeVar("T")


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

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; ``limit`` keeps the newest ``limit`` (0: none, None: all;
        a negative limit is a ValueError)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class NoteBatchStore(Protocol):
    """A store that appends several notes in one atomic step (all of them or none).

    The built-in stores also take ``fence=``: a thread's :class:`~tinyctx.threads.Lease`,
    checked in the same atomic step as the append, exactly like a thread write's lease.
    """

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Note]: ...


@runtime_checkable
class NoteDeleteStore(Protocol):
    """A store that can erase one namespace's notes (one user's data, on request)."""

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace``; how many were removed (0 if none)."""
        ...


async def append_notes(
    store: Store,
    namespace: str,
    texts: Sequence[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    fence: Lease | None = None,
) -> list[Note]:
    """Append ``texts`` as notes, atomically when ``store`` is a :class:`NoteBatchStore`.

    A store with only ``append_note`` gets them one by one (a failure part-way keeps the
    notes already appended: such a store cannot do better).

    ``fence``: a thread's lease (``ctx.thread_lease()``). A store whose ``append_notes``
    takes ``fence=`` (every built-in one) appends only while that lease's token is still
    the thread's newest, in the same atomic step, else raises
    :class:`~tinyctx.threads.FencedOut` with nothing written. Other stores append
    unfenced.
    """
    if not texts:
        return []
    if isinstance(store, NoteBatchStore):
        if fence is not None and _takes_fence(store):
            append: Any = store.append_notes
            notes: list[Note] = await append(namespace, texts, metadata=metadata, fence=fence)
            return notes
        return await store.append_notes(namespace, texts, metadata=metadata)
    return [await store.append_note(namespace, text, metadata=metadata) for text in texts]


def _takes_fence(store: NoteBatchStore) -> bool:
    """Whether ``store.append_notes`` accepts ``fence=`` (asked each time: a wrapper that
    delegates may wrap stores of either kind)."""
    try:
        parameters = inspect.signature(store.append_notes).parameters
    except (TypeError, ValueError):
        return False
    return "fence" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def check_fence(fence: Lease | None) -> None:
    """``fence=`` must be None or a :class:`~tinyctx.threads.Lease` (TypeError otherwise)."""
    if fence is not None and not isinstance(fence, Lease):
        raise TypeError(f"append_notes(fence=...) must be a Lease or None, got {fence!r}")
    if fence is not None:
        check_thread_id(fence.thread_id)


def check_lease(lease: object, method: str) -> Lease:
    """``lease`` for ``renew_lease``/``release_lease``: a Lease of a valid thread id."""
    if not isinstance(lease, Lease):
        raise TypeError(f"{method} needs a Lease, got {type(lease).__name__}")
    check_thread_id(lease.thread_id)
    return lease


def _retention(value: float | None, owner: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(
            "archive_retention", value, "None (keep forever) or seconds >= 0", owner=owner
        )
    return float(value)


def _check_thread_id(thread_id: str) -> None:
    check_thread_id(thread_id)


def _check_list_args(prefix: str, limit: int | None) -> None:
    if not isinstance(prefix, str):
        raise TypeError(f"list_threads(prefix=...) must be a str, got {type(prefix).__name__}")
    check_thread_id(prefix, field="prefix")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"list_threads(limit={limit!r}): limit must be None or an integer >= 0")


class _MemoryThread:
    __slots__ = ("archive", "checkpoint", "lease", "log", "messages", "state", "version")

    def __init__(self) -> None:
        self.version = 0
        # what each write did: (version, at, appended, start, end, replaced)
        self.log: list[tuple[int, float, int, int | None, int | None, int]] = []
        self.messages: list[str] = []
        self.checkpoint: str | None = None
        self.state: str | None = None
        self.lease: Lease | None = None
        self.archive: list[ArchivedRange] = []


class MemoryStore(MemoryLifecycle):
    """A process-local :class:`Store` and :class:`~tinyctx.threads.ThreadStore`.

    Values are deep-copied in and out, as a real store would; thread documents are
    strings (immutable). Every thread operation is one synchronous step after a
    checkpoint, so it is atomic for every task of the event loop. ``archive_retention``
    (seconds, None: forever) bounds how long compacted originals stay readable.
    """

    def __init__(self, *, archive_retention: float | None = None) -> None:
        self._data: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, list[Note]] = {}
        self._lock = anyio.Lock()
        self._threads: dict[str, _MemoryThread] = {}
        self._last_token = 0
        self._closed = False
        self.archive_retention = _retention(archive_retention, "MemoryStore")

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
        (text,) = _note_texts((text,))
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
        texts = _note_texts(texts)
        check_fence(fence)
        meta = frozen_mapping(metadata)
        async with self._lock:
            self._check_open()
            if fence is not None:  # nothing awaits from the check to the append
                thread = self._threads.get(fence.thread_id)
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
        _check_limit(limit)
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
        _check_thread_id(thread_id)
        await self._ready()
        thread = self._threads.get(thread_id)
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
        thread = self._threads.get(thread_id)
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
        if compaction is None:
            thread.log.append((new_version, now, len(change.append), None, None, 0))
        else:
            entry = (compaction.start, compaction.end, len(compaction.replacement))
            thread.log.append((new_version, now, len(change.append), *entry))
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
        thread = self._threads.get(thread_id)
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
        thread = self._threads.get(lease.thread_id)
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
        thread = self._threads.get(lease.thread_id)
        if thread is None or thread.lease is None or thread.lease.token != lease.token:
            return
        thread.lease = None
        if thread.version == 0:
            del self._threads[lease.thread_id]  # a lease alone leaves nothing behind

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        """Ids of the threads written at least once, sorted, optionally by ``prefix``."""
        _check_list_args(prefix, limit)
        await self._ready()
        ids = sorted(
            tid for tid, t in self._threads.items() if t.version > 0 and tid.startswith(prefix)
        )
        return ids if limit is None else ids[:limit]

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        """What compactions replaced on ``thread_id``, oldest first, within retention."""
        _check_thread_id(thread_id)
        await self._ready()
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        self._purge_archive(thread, time.time())
        return list(thread.archive)

    async def delete_thread(self, thread_id: str) -> bool:
        """Remove the thread, its archive, checkpoint, state and lease; False if unknown."""
        _check_thread_id(thread_id)
        await self._ready()
        return self._threads.pop(thread_id, None) is not None

    async def aclose(self) -> None:
        """Close the store: later calls raise :class:`StoreClosed`. Idempotent."""
        await anyio.lowlevel.checkpoint()
        self._closed = True


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


def _note_texts(texts: Sequence[object]) -> tuple[str, ...]:
    if isinstance(texts, str):
        raise TypeError("append_notes: texts must be a sequence of strings, not one string")
    result: list[str] = []
    for index, text in enumerate(texts):
        if isinstance(text, str):
            result.append(valid_text(text))
        else:
            kind = type(text).__name__
            raise TypeError(f"append_notes: texts[{index}] must be a str, got {kind}")
    return tuple(result)


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"notes(limit={limit!r}): limit must be None or an integer >= 0")


# ---------------------------------------------------------------------------------------
# SQLite


class StoreError(TinyCtxError):
    """Base of the errors a store raises about itself (closed, unreachable, a schema it
    cannot open, a write whose outcome is unknown)."""


class StoreSchemaError(StoreError):
    """The file is not a tinyctx store this version can open (not SQLite, or newer)."""


class StoreClosed(StoreError):
    """The store was closed with ``aclose()``."""


class StoreAuthenticationFailed(StoreError):
    """The database refused the store's login (a wrong password, an unknown user, no
    ``pg_hba.conf`` entry for it); the message names user, host and port, never the
    password. Retrying does not help: fix the URL."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store's server could not be reached, or did not answer the connection within
    the connect timeout (the URL's, else the store's ``timeout``). ``address`` names it
    (``host:port``, never a password); the driver's error, when there is one, is the
    ``__cause__``. Nothing was written."""

    def __init__(self, message: str, *, address: str = "") -> None:
        self.address = address
        super().__init__(message)


class WriteOutcomeUnknown(StoreError, TimeoutError):
    """A thread write was sent and no answer came within the write bound (the server
    stalled, or the connection broke mid-call): it may have landed or not.

    Look before you retry: open the thread again (a new ``Session`` loads what the store
    holds, which resolves it) and check whether your input is there before sending it
    again. ``thread_id`` names the thread, ``expected_version`` the version the write was
    made against (a stored version past it means the write landed) and ``seconds`` the
    bound it exceeded. Also a :class:`TimeoutError`.
    """

    def __init__(self, thread_id: str, *, expected_version: int, seconds: float) -> None:
        self.thread_id = thread_id
        self.expected_version = expected_version
        self.seconds = seconds
        super().__init__(
            f"writing thread {thread_id!r} (at version {expected_version}) got no answer "
            f"within {seconds:g}s: it may have landed or not; open the thread and look "
            "before you retry"
        )


SCHEMA_VERSION = 5
"""The schema version :class:`SqliteStore` writes; older files are migrated on open."""

# _MIGRATIONS[n] takes a file from version n to version n + 1, inside one transaction.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: namespaced key/value data (JSON) and append-only notes
    (
        "CREATE TABLE tinyctx_kv (namespace TEXT NOT NULL, key TEXT NOT NULL, "
        "value TEXT NOT NULL, PRIMARY KEY (namespace, key)) WITHOUT ROWID",
        "CREATE TABLE tinyctx_notes (namespace TEXT NOT NULL, seq INTEGER NOT NULL, "
        "text TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (namespace, seq))",
    ),
    # 2: note metadata (a JSON object) and when a value was last written
    (
        "ALTER TABLE tinyctx_notes ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE tinyctx_kv ADD COLUMN updated_at REAL NOT NULL DEFAULT 0",
    ),
    # 3: durable threads. A thread row holds the version, the live length, the position
    # after which appends go, the checkpoint, the layer state and the lease. Messages are
    # rows ordered by a sparse integer position (appends step by _GAP), so an append inserts
    # only its rows and a compaction deletes the replaced rows and places the replacement
    # between its neighbours: nothing else is rewritten.
    (
        "CREATE TABLE tinyctx_threads (thread_id TEXT NOT NULL PRIMARY KEY, "
        "version INTEGER NOT NULL, length INTEGER NOT NULL, last_pos INTEGER NOT NULL, "
        "checkpoint TEXT, state TEXT, lease_owner TEXT, lease_token INTEGER, "
        "lease_expires REAL, updated_at REAL NOT NULL) WITHOUT ROWID",
        "CREATE TABLE tinyctx_messages (thread_id TEXT NOT NULL, pos INTEGER NOT NULL, "
        "doc TEXT NOT NULL, PRIMARY KEY (thread_id, pos)) WITHOUT ROWID",
        "CREATE TABLE tinyctx_archive (thread_id TEXT NOT NULL, version INTEGER NOT NULL, "
        "start INTEGER NOT NULL, stop INTEGER NOT NULL, archived_at REAL NOT NULL, "
        "PRIMARY KEY (thread_id, version)) WITHOUT ROWID",
        "CREATE INDEX tinyctx_archive_age ON tinyctx_archive (archived_at)",
        "CREATE TABLE tinyctx_archive_messages (thread_id TEXT NOT NULL, "
        "version INTEGER NOT NULL, idx INTEGER NOT NULL, doc TEXT NOT NULL, "
        "PRIMARY KEY (thread_id, version, idx)) WITHOUT ROWID",
        "CREATE TABLE tinyctx_counters (name TEXT NOT NULL PRIMARY KEY, "
        "value INTEGER NOT NULL) WITHOUT ROWID",
    ),
    # 4: a message's text content in a column of its own (``documents.split_document``):
    # read back as text, not unescaped out of JSON; ``doc`` then holds the document with
    # ``null`` in the text's place, which an older release refuses to decode (loudly) rather
    # than misread. NULL: ``doc`` is the whole document (every row written before, and
    # documents whose text stays in them).
    (
        "ALTER TABLE tinyctx_messages ADD COLUMN content TEXT",
        "ALTER TABLE tinyctx_archive_messages ADD COLUMN content TEXT",
    ),
    # 5: what each write did (tinyctx.versions): how many messages it appended and which
    # range a compaction replaced by how many, so an old version can be rebuilt from the
    # live log and the archive. Writes from before have no row (out of reach).
    (
        "CREATE TABLE tinyctx_versions (thread_id TEXT NOT NULL, version INTEGER NOT NULL, "
        "written_at REAL NOT NULL, appended INTEGER NOT NULL, start INTEGER, stop INTEGER, "
        "replaced INTEGER NOT NULL, PRIMARY KEY (thread_id, version)) WITHOUT ROWID",
    ),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


class _Connection(sqlite3.Connection):
    """A store's connection: its file's path and the schema cookie (SQLite's
    ``schema_version``, changed by every schema change) it last found at this release's
    schema version."""

    path = ""
    schema_cookie: int | None = None


def _check_schema(conn: sqlite3.Connection) -> None:
    """Inside a transaction: refuse a file another process migrated past this release's
    schema while this connection was open (its rows may be in a layout this code misreads).
    One pragma when nothing changed."""
    if not isinstance(conn, _Connection) or conn.schema_cookie is None:
        return  # migrating on open, or not a store's connection
    (cookie,) = conn.execute("PRAGMA schema_version").fetchone()
    if cookie == conn.schema_cookie:
        return
    version = _stored_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"{conn.path}: migrated to schema version {version} by a newer tinyctx while "
            f"this store had it open (this one reads up to version {SCHEMA_VERSION}); run "
            "this process on the newer release"
        )
    conn.schema_cookie = cookie


class _Immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is taken up front, so two writers
    wait for each other (busy timeout) instead of failing on a lock upgrade. A file a newer
    release migrated meanwhile is refused before anything is read or written."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        _begin(self._conn, "BEGIN IMMEDIATE")
        return self._conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        conn = self._conn
        if exc_type is None:
            try:
                conn.execute("COMMIT")
                return
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _begin(conn: sqlite3.Connection, statement: str) -> None:
    conn.execute(statement)
    try:
        _check_schema(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _stored_version(conn: sqlite3.Connection) -> int:
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tinyctx_schema'"
    ).fetchone()
    if has_table is None:
        return 0
    row = conn.execute("SELECT version FROM tinyctx_schema WHERE id = 1").fetchone()
    return int(row[0]) if row is not None else 0


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    version = _stored_version(conn)
    if version == SCHEMA_VERSION:
        return
    with _Immediate(conn):
        # re-read under the write lock: another process may have migrated meanwhile
        version = _stored_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{path}: schema version {version} was written by a newer tinyctx "
                f"(this one reads up to version {SCHEMA_VERSION})"
            )
        if version == SCHEMA_VERSION:
            return
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tinyctx_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "version INTEGER NOT NULL, updated_at REAL NOT NULL)"
        )
        for number in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[number]:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO tinyctx_schema (id, version, updated_at) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
            "updated_at = excluded.updated_at",
            (SCHEMA_VERSION, time.time()),
        )


def _encode(value: Any, what: str, *, owner: str = "SqliteStore") -> str:
    try:
        return json.dumps(thaw(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{owner}: {what} must be JSON-serializable ({exc})") from None


def _note_from_row(namespace: str, row: tuple[Any, ...]) -> Note:
    seq, text, created_at, metadata = row
    return Note(namespace, int(seq), str(text), float(created_at), json.loads(metadata))


def _append(
    conn: sqlite3.Connection,
    namespace: str,
    texts: tuple[str, ...],
    metadata: str,
    fence: Lease | None = None,
) -> list[Note]:
    with _Immediate(conn):
        if fence is not None:
            row = conn.execute(
                "SELECT lease_token FROM tinyctx_threads WHERE thread_id = ?", (fence.thread_id,)
            ).fetchone()
            token = None if row is None else row[0]
            if token != fence.token:
                raise FencedOut(fence.thread_id, fence.token, token)
        (last,) = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM tinyctx_notes WHERE namespace = ?", (namespace,)
        ).fetchone()
        now = time.time()
        rows = [(namespace, last + i, text, now, metadata) for i, text in enumerate(texts, 1)]
        conn.executemany(
            "INSERT INTO tinyctx_notes (namespace, seq, text, created_at, metadata) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
    meta = frozen_mapping(json.loads(metadata))
    return [Note(namespace, seq, text, now, meta) for _, seq, text, _, _ in rows]


def _enable_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch the file to WAL, waiting up to ``timeout`` for the exclusive lock it needs.

    SQLite does not consult the busy handler for this switch, so concurrent first opens of
    one file would fail with "database is locked" at once; retry with backoff instead (this
    runs in a worker thread, so sleeping is fine). Once a file is in WAL mode the pragma is
    a no-op that takes no lock.
    """
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


# -- threads in SQLite (each function runs in the store's worker thread) -------------------

_GAP = 1 << 20
"""Distance between the positions of appended messages: room for inserting replacements."""


class _Read:
    """A read transaction: the thread row and its messages from one snapshot."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        _begin(self._conn, "BEGIN")
        return self._conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


_THREAD_ROW = (
    "SELECT version, length, last_pos, checkpoint, state, lease_owner, lease_token, "
    "lease_expires FROM tinyctx_threads WHERE thread_id = ?"
)


_SQLITE_KINDS: Final = {bytes: "a BLOB", str: "text", float: "a REAL", type(None): "NULL"}


def _check_integers(
    thread_id: str, row: tuple[Any, ...], columns: Sequence[tuple[int, str, bool]]
) -> None:
    """:class:`StoreSchemaError` unless each ``(index, column, nullable)`` of a thread row
    holds an integer (or NULL where allowed): a row edited outside tinyctx is named, never
    read as a version or a token of the wrong type."""
    for index, column, nullable in columns:
        value = row[index]
        if type(value) is int or (nullable and value is None):
            continue
        kind = _SQLITE_KINDS.get(type(value), type(value).__name__)
        raise StoreSchemaError(
            f"thread {thread_id!r}: tinyctx_threads.{column} holds {kind} ({value!r:.60}), "
            "not an integer; the row was changed outside tinyctx (restore it from a backup, "
            "or delete_thread() it)"
        )


_ROW_INTEGERS: Final = ((0, "version", False), (1, "length", False), (6, "lease_token", True))


def _lease_of(thread_id: str, row: tuple[Any, ...] | None) -> Lease | None:
    if row is None:
        return None
    _check_integers(thread_id, row, _ROW_INTEGERS)
    if row[6] is None:
        return None
    return Lease(thread_id, str(row[5]), int(row[6]), float(row[7]))


def _load_thread(conn: sqlite3.Connection, thread_id: str) -> ThreadRecord:
    with _Read(conn):
        row = conn.execute(_THREAD_ROW, (thread_id,)).fetchone()
        if row is None:
            return ThreadRecord(thread_id, 0, ())
        _check_integers(thread_id, row, _ROW_INTEGERS)
        with gc_paused(row[1]):  # a row tuple per message: see tinyctx._gc
            rows = conn.execute(
                "SELECT doc, content FROM tinyctx_messages WHERE thread_id = ? ORDER BY pos",
                (thread_id,),
            ).fetchall()
    return ThreadRecord(
        thread_id, row[0], SplitDocuments(rows), row[3], row[4], _lease_of(thread_id, row)
    )


def _purge_archive(conn: sqlite3.Connection, retention: float | None, now: float) -> None:
    if retention is None:
        return
    cutoff = now - retention
    conn.execute(
        "DELETE FROM tinyctx_archive_messages WHERE (thread_id, version) IN "
        "(SELECT thread_id, version FROM tinyctx_archive WHERE archived_at < ?)",
        (cutoff,),
    )
    conn.execute("DELETE FROM tinyctx_archive WHERE archived_at < ?", (cutoff,))


def _spread(low: int | None, high: int | None, count: int) -> tuple[int, list[int]] | None:
    """``count`` increasing positions strictly between ``low`` and ``high`` (None: open end),
    or None when the gap is too narrow."""
    if low is None and high is None:
        low, high = 0, _GAP * (count + 1)
    elif low is None:
        assert high is not None
        low = high - _GAP * (count + 1)
    elif high is None:
        high = low + _GAP * (count + 1)
    if high - low <= count:
        return None
    return low, [low + (high - low) * (i + 1) // (count + 1) for i in range(count)]


def _compact(
    conn: sqlite3.Connection,
    thread_id: str,
    start: int,
    end: int,
    replacement: list[tuple[str, str | None]],
    length: int,
    last_pos: int,
    version: int,
    now: float,
) -> int:
    """Apply one compaction; returns the position appends now follow (``last_pos`` moved
    up when the tail had to make room, or a replacement placed after it)."""
    removed = end - start
    first = max(start - 1, 0)
    wanted = (end + 1) - first  # the neighbours on both sides and the replaced rows
    positions = [
        p
        for (p,) in conn.execute(
            "SELECT pos FROM tinyctx_messages WHERE thread_id = ? ORDER BY pos LIMIT ? OFFSET ?",
            (thread_id, wanted, first),
        ).fetchall()
    ]
    by_index = dict(enumerate(positions, start=first))
    before = by_index.get(start - 1) if start > 0 else None
    after = by_index.get(end) if end < length else None
    if removed:
        low_pos, high_pos = by_index[start], by_index[end - 1]
        docs = conn.execute(
            "SELECT doc, content FROM tinyctx_messages WHERE thread_id = ? "
            "AND pos BETWEEN ? AND ? ORDER BY pos",
            (thread_id, low_pos, high_pos),
        ).fetchall()
        conn.execute(
            "INSERT INTO tinyctx_archive (thread_id, version, start, stop, archived_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (thread_id, version, start, end, now),
        )
        conn.executemany(
            "INSERT INTO tinyctx_archive_messages (thread_id, version, idx, doc, content) "
            "VALUES (?, ?, ?, ?, ?)",
            [(thread_id, version, i, d, c) for i, (d, c) in enumerate(docs)],
        )
        conn.execute(
            "DELETE FROM tinyctx_messages WHERE thread_id = ? AND pos BETWEEN ? AND ?",
            (thread_id, low_pos, high_pos),
        )
    if not replacement:
        return last_pos
    spread = _spread(before, after, len(replacement))
    if spread is None:
        # no room between the neighbours (many inserts at one spot): move the tail up by
        # `shift`, in two steps through positions above every row (last_pos is the
        # highest), so no two rows ever share a position while SQLite updates them
        assert after is not None
        shift = _GAP * (len(replacement) + 1)
        lift = last_pos - after + 1 + shift
        conn.execute(
            "UPDATE tinyctx_messages SET pos = pos + ? WHERE thread_id = ? AND pos >= ?",
            (lift, thread_id, after),
        )
        conn.execute(
            "UPDATE tinyctx_messages SET pos = pos - ? WHERE thread_id = ? AND pos > ?",
            (lift - shift, thread_id, last_pos),
        )
        spread = _spread(before, after + shift, len(replacement))
        assert spread is not None
        last_pos += shift
    placed = spread[1]
    conn.executemany(
        "INSERT INTO tinyctx_messages (thread_id, pos, doc, content) VALUES (?, ?, ?, ?)",
        [(thread_id, p, d, c) for p, (d, c) in zip(placed, replacement, strict=True)],
    )
    return max(last_pos, placed[-1])


def _write_thread(
    conn: sqlite3.Connection,
    thread_id: str,
    change: ThreadWrite,
    expected_version: int,
    lease: Lease | None,
    retention: float | None,
) -> int:
    # texts apart from their documents before the write lock is taken
    append = [split_document(doc) for doc in change.append]
    compaction = change.compaction
    replacement = (
        [split_document(doc) for doc in compaction.replacement] if compaction is not None else []
    )
    with _Immediate(conn):
        row = conn.execute(
            "SELECT version, length, last_pos, lease_token FROM tinyctx_threads "
            "WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        if row is not None:
            _check_integers(
                thread_id,
                row,
                ((0, "version", False), (1, "length", False), (2, "last_pos", False)),
            )
            _check_integers(thread_id, row, ((3, "lease_token", True),))
        version, length, last_pos, token = row if row is not None else (0, 0, 0, None)
        if lease is not None and token != lease.token:
            raise FencedOut(thread_id, lease.token, token)
        if version != expected_version:
            raise StaleThreadVersion(thread_id, expected_version, version)
        check_write_range(thread_id, change, length)
        now = time.time()
        new_version = version + 1
        if row is None:
            conn.execute(
                "INSERT INTO tinyctx_threads (thread_id, version, length, last_pos, updated_at) "
                "VALUES (?, 0, 0, 0, ?)",
                (thread_id, now),
            )
        if compaction is not None:
            last_pos = _compact(
                conn,
                thread_id,
                compaction.start,
                compaction.end,
                replacement,
                length,
                last_pos,
                new_version,
                now,
            )
            length += len(compaction.replacement) - (compaction.end - compaction.start)
            _purge_archive(conn, retention, now)
        if append:
            conn.executemany(
                "INSERT INTO tinyctx_messages (thread_id, pos, doc, content) VALUES (?, ?, ?, ?)",
                [(thread_id, last_pos + _GAP * i, d, c) for i, (d, c) in enumerate(append, 1)],
            )
            last_pos += _GAP * len(append)
            length += len(append)
        conn.execute(
            "INSERT INTO tinyctx_versions (thread_id, version, written_at, appended, start, "
            "stop, replaced) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                thread_id,
                new_version,
                now,
                len(append),
                None if compaction is None else compaction.start,
                None if compaction is None else compaction.end,
                len(replacement),
            ),
        )
        sets = "version = ?, length = ?, last_pos = ?, updated_at = ?"
        values: list[Any] = [new_version, length, last_pos, now]
        if not isinstance(change.checkpoint, Unchanged):
            sets += ", checkpoint = ?"
            values.append(change.checkpoint)
        if not isinstance(change.state, Unchanged):
            sets += ", state = ?"
            values.append(change.state)
        values.append(thread_id)
        conn.execute(f"UPDATE tinyctx_threads SET {sets} WHERE thread_id = ?", values)
    return new_version


def _next_token(conn: sqlite3.Connection) -> int:
    (token,) = conn.execute(
        "INSERT INTO tinyctx_counters (name, value) VALUES ('lease_token', 1) "
        "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value"
    ).fetchone()
    return int(token)


def _acquire_lease(conn: sqlite3.Connection, thread_id: str, owner: str, ttl: float) -> Lease:
    with _Immediate(conn):
        row = conn.execute(_THREAD_ROW, (thread_id,)).fetchone()
        now = time.time()
        current = _lease_of(thread_id, row)
        if current is not None and current.owner != owner and current.expires_at > now:
            raise LeaseHeld(thread_id, current.owner, current.expires_at)
        lease = Lease(thread_id, owner, _next_token(conn), now + ttl)
        conn.execute(
            "INSERT INTO tinyctx_threads (thread_id, version, length, last_pos, lease_owner, "
            "lease_token, lease_expires, updated_at) VALUES (?, 0, 0, 0, ?, ?, ?, ?) "
            "ON CONFLICT (thread_id) DO UPDATE SET lease_owner = excluded.lease_owner, "
            "lease_token = excluded.lease_token, lease_expires = excluded.lease_expires",
            (thread_id, owner, lease.token, lease.expires_at, now),
        )
    return lease


def _renew_lease(conn: sqlite3.Connection, lease: Lease, ttl: float) -> Lease:
    with _Immediate(conn):
        row = conn.execute(
            "SELECT lease_token, lease_owner FROM tinyctx_threads WHERE thread_id = ?",
            (lease.thread_id,),
        ).fetchone()
        token = row[0] if row is not None else None
        if token != lease.token:
            raise FencedOut(lease.thread_id, lease.token, token)
        renewed = Lease(lease.thread_id, str(row[1]), lease.token, time.time() + ttl)
        conn.execute(
            "UPDATE tinyctx_threads SET lease_expires = ? WHERE thread_id = ?",
            (renewed.expires_at, lease.thread_id),
        )
    return renewed


def _release_lease(conn: sqlite3.Connection, lease: Lease) -> None:
    with _Immediate(conn):
        conn.execute(
            "UPDATE tinyctx_threads SET lease_owner = NULL, lease_token = NULL, "
            "lease_expires = NULL WHERE thread_id = ? AND lease_token = ?",
            (lease.thread_id, lease.token),
        )
        # a lease alone (never written) leaves nothing behind
        conn.execute(
            "DELETE FROM tinyctx_threads WHERE thread_id = ? AND version = 0 "
            "AND lease_token IS NULL",
            (lease.thread_id,),
        )


def _prefix_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (None: none)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            following = last + 1
            if 0xD800 <= following <= 0xDFFF:  # surrogates are not stored: skip them
                following = 0xE000
            return prefix[:-1] + chr(following)
        prefix = prefix[:-1]
    return None


def _list_threads(conn: sqlite3.Connection, prefix: str, limit: int | None) -> list[str]:
    query = "SELECT thread_id FROM tinyctx_threads WHERE version > 0 AND thread_id >= ?"
    args: list[Any] = [prefix]
    end = _prefix_end(prefix)
    if end is not None:
        query += " AND thread_id < ?"
        args.append(end)
    query += " ORDER BY thread_id"
    if limit is not None:
        query += " LIMIT ?"
        args.append(limit)
    return [str(t) for (t,) in conn.execute(query, args).fetchall()]


def _archived(
    conn: sqlite3.Connection, thread_id: str, retention: float | None
) -> list[ArchivedRange]:
    now = time.time()
    cutoff = -math.inf if retention is None else now - retention
    with _Read(conn):
        ranges = conn.execute(
            "SELECT version, start, stop, archived_at FROM tinyctx_archive "
            "WHERE thread_id = ? AND archived_at >= ? ORDER BY version",
            (thread_id, cutoff),
        ).fetchall()
        rows = conn.execute(
            "SELECT m.version, m.doc, m.content FROM tinyctx_archive_messages AS m "
            "JOIN tinyctx_archive AS a ON a.thread_id = m.thread_id AND a.version = m.version "
            "WHERE m.thread_id = ? AND a.archived_at >= ? ORDER BY m.version, m.idx",
            (thread_id, cutoff),
        ).fetchall()
    docs: dict[int, list[str]] = {}
    for version, doc, content in rows:
        docs.setdefault(version, []).append(join_document(doc, content))
    return [
        ArchivedRange(thread_id, v, start, stop, tuple(docs.get(v, ())), at)
        for v, start, stop, at in ranges
    ]


def _delete_thread(conn: sqlite3.Connection, thread_id: str) -> bool:
    with _Immediate(conn):
        found = conn.execute(
            "DELETE FROM tinyctx_threads WHERE thread_id = ?", (thread_id,)
        ).rowcount
        for table in (
            "tinyctx_messages",
            "tinyctx_archive",
            "tinyctx_archive_messages",
            "tinyctx_versions",
        ):
            found += conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,)).rowcount
    return found > 0


_BUSY_SLICE = 0.05
"""SQLite's own busy wait, in seconds: a call waiting for another writer's lock retries in
slices this long until the store's ``timeout``, so a cancelled caller's call gives up
within one slice (SQLite's busy handler heeds no interrupt)."""


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (another connection's lock)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or (
        code is None and "locked" in str(exc)
    )


DEFAULT_CACHE_BYTES: Final = 64 << 20
"""``SqliteStore(cache_bytes=...)``: SQLite's page cache for the store's connection."""


class SqliteStore(SqliteLifecycle):
    """A :class:`Store` in one SQLite file: the embedded default for notes and data.

    - WAL journal (readers never wait for the writer), ``synchronous=NORMAL``.
    - One connection per store, used from the store's own thread (:class:`WorkerThread`) one
      operation at a time; nothing touches the disk on the event loop.
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
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError("path", path, "a file path (str or os.PathLike)", owner="SqliteStore")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError("timeout", timeout, "a number of seconds > 0", owner="SqliteStore")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ConfigError(
                "cache_bytes", cache_bytes, "an integer number of bytes >= 0", owner="SqliteStore"
            )
        if isinstance(mmap_bytes, bool) or not isinstance(mmap_bytes, int) or mmap_bytes < 0:
            raise ConfigError(
                "mmap_bytes", mmap_bytes, "an integer number of bytes >= 0", owner="SqliteStore"
            )
        self.path: str = os.fspath(path)
        self.timeout = float(timeout)
        self.cache_bytes = cache_bytes
        self.mmap_bytes = mmap_bytes
        self.archive_retention = _retention(archive_retention, "SqliteStore")
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._worker = WorkerThread(f"tinyctx-sqlite {self.path}")
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
                    return fn(conn)
            except sqlite3.OperationalError as exc:
                # busy: nothing was done (a write takes its lock first, a read reads only)
                if not _busy(exc) or cancel_requested() or time.monotonic() >= deadline:
                    raise

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=_BUSY_SLICE,
                isolation_level=None,
                check_same_thread=False,
                factory=_Connection,
            )
        except sqlite3.OperationalError as exc:  # SQLite's message names no file
            raise sqlite3.OperationalError(
                f"{exc}: {self.path!r} (does its directory exist, and may this process "
                "write there?)"
            ) from exc
        try:
            _enable_wal(conn, self.timeout)
            conn.execute("PRAGMA synchronous=NORMAL")
            # SQLite walks a long thread's pages through its page cache (2 MB by default,
            # less than a 2000-message thread): a cache that holds the threads a process
            # serves saves re-reading them on every load (pages are allocated as used;
            # another connection's write invalidates them). Off by default, a memory map
            # would read pages without the copy, but every page it maps stays in the
            # process's RSS: it grew with the file, past the cache's bound (issue #32)
            conn.execute(f"PRAGMA mmap_size={self.mmap_bytes}")
            conn.execute(f"PRAGMA cache_size={-(self.cache_bytes // 1024)}")
            _migrate(conn, self.path)
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
        return await self._run(_stored_version)

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
        encoded = _encode(value, f"the value of {namespace!r}/{key!r}")

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
        items = _note_texts(texts)
        check_fence(fence)
        if not items:
            return []
        meta = _encode(metadata or {}, "note metadata")
        return await self._run(lambda conn: _append(conn, namespace, items, meta, fence))

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; with ``limit``, only the newest ``limit`` of them."""
        _check_limit(limit)
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
        return [_note_from_row(namespace, row) for row in rows]

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace`` in one transaction; numbering starts again at 1."""

        def delete(conn: sqlite3.Connection) -> int:
            with _Immediate(conn):
                cursor = conn.execute("DELETE FROM tinyctx_notes WHERE namespace = ?", (namespace,))
                return cursor.rowcount

        return await self._run(delete)

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now, from one snapshot; an unknown thread is empty at version 0."""
        _check_thread_id(thread_id)
        return await self._run(lambda conn: _load_thread(conn, thread_id))

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
        retention = self.archive_retention
        return await self._run(
            lambda conn: _write_thread(conn, thread_id, change, expected_version, lease, retention)
        )

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """A new lease with a fresh token; :class:`LeaseHeld` while another owner's is live."""
        validate_lease_request(thread_id, owner, ttl)
        return await self._run(lambda conn: _acquire_lease(conn, thread_id, owner, float(ttl)))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` (same token); :class:`FencedOut` if another lease replaced it."""
        check_lease(lease, "renew_lease")
        validate_lease_request(lease.thread_id, lease.owner, ttl)
        return await self._run(lambda conn: _renew_lease(conn, lease, float(ttl)))

    async def release_lease(self, lease: Lease) -> None:
        """Give the thread up; a no-op when ``lease`` was already replaced or released."""
        check_lease(lease, "release_lease")
        await self._run(lambda conn: _release_lease(conn, lease))

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        """Ids of the threads written at least once, sorted, optionally by ``prefix``."""
        _check_list_args(prefix, limit)
        return await self._run(lambda conn: _list_threads(conn, prefix, limit))

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        """What compactions replaced on ``thread_id``, oldest first, within retention."""
        _check_thread_id(thread_id)
        retention = self.archive_retention
        return await self._run(lambda conn: _archived(conn, thread_id, retention))

    async def purge_archive(self) -> None:
        """Drop every archived range older than ``archive_retention`` (all threads) now.

        Writes that compact do this as they go; call it from a periodic job to bound the
        file when threads stop compacting.
        """
        retention = self.archive_retention

        def purge(conn: sqlite3.Connection) -> None:
            with _Immediate(conn):
                _purge_archive(conn, retention, time.time())

        await self._run(purge)

    async def delete_thread(self, thread_id: str) -> bool:
        """Remove the thread, its archive, checkpoint, state and lease; False if unknown."""
        _check_thread_id(thread_id)
        return await self._run(lambda conn: _delete_thread(conn, thread_id))
