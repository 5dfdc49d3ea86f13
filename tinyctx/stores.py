"""Stores: namespaced key/value data and append-only notes that outlive a session.

A :class:`Store` is what a layer or tool writes to when something must survive the run
(session-memory notes, caches keyed by thread or user). A :class:`StoreRegistry` names
the stores a context carries; it is shared by every derived context.

:class:`MemoryStore` lives in the process; :class:`SqliteStore` is the embedded default
for anything that must survive a restart (one file, WAL, a versioned schema migrated on
open). Both also implement :class:`NoteBatchStore`: several notes appended atomically.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
from attrs import field, frozen

from .errors import ConfigError, TinyCtxError
from .frozen import EMPTY, FrozenDict, frozen_mapping, thaw

__all__ = [
    "Store",
    "Note",
    "StoreRegistry",
    "MemoryStore",
    "NoteBatchStore",
    "append_notes",
    "SqliteStore",
    "StoreSchemaError",
    "StoreClosed",
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

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class NoteBatchStore(Protocol):
    """A store that appends several notes in one atomic step (all of them or none)."""

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Note]: ...


async def append_notes(
    store: Store,
    namespace: str,
    texts: Sequence[str],
    *,
    metadata: Mapping[str, Any] | None = None,
) -> list[Note]:
    """Append ``texts`` as notes, atomically when ``store`` is a :class:`NoteBatchStore`.

    A store with only ``append_note`` gets them one by one (a failure part-way keeps the
    notes already appended: such a store cannot do better).
    """
    if not texts:
        return []
    if isinstance(store, NoteBatchStore):
        return await store.append_notes(namespace, texts, metadata=metadata)
    return [await store.append_note(namespace, text, metadata=metadata) for text in texts]


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

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Note]:
        """Append every text as a note with consecutive ``seq`` values, atomically."""
        texts = _note_texts(texts)
        meta = frozen_mapping(metadata)
        async with self._lock:
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


def _note_texts(texts: Sequence[object]) -> tuple[str, ...]:
    if isinstance(texts, str):
        raise TypeError("append_notes: texts must be a sequence of strings, not one string")
    result: list[str] = []
    for index, text in enumerate(texts):
        if isinstance(text, str):
            result.append(text)
        else:
            kind = type(text).__name__
            raise TypeError(f"append_notes: texts[{index}] must be a str, got {kind}")
    return tuple(result)


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"notes(limit={limit!r}): limit must be None or an integer >= 0")


# ---------------------------------------------------------------------------------------
# SQLite


class StoreSchemaError(TinyCtxError):
    """The file is not a tinyctx store this version can open (not SQLite, or newer)."""


class StoreClosed(TinyCtxError):
    """The store was closed with ``aclose()``."""


SCHEMA_VERSION = 2
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
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


class _Immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is taken up front, so two writers
    wait for each other (busy timeout) instead of failing on a lock upgrade."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
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
    conn: sqlite3.Connection, namespace: str, texts: tuple[str, ...], metadata: str
) -> list[Note]:
    with _Immediate(conn):
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


class SqliteStore:
    """A :class:`Store` in one SQLite file: the embedded default for notes and data.

    - WAL journal (readers never wait for the writer), ``synchronous=NORMAL``.
    - One connection per store, used from worker threads (``anyio.to_thread``) one
      operation at a time; nothing touches the disk on the event loop.
    - Writes that read-then-insert (note sequence numbers) run in ``BEGIN IMMEDIATE``
      transactions, and ``timeout`` is SQLite's busy timeout: many stores (or processes)
      on one file wait for each other instead of losing or duplicating notes.
    - A schema version table; an older file is migrated on open, a newer one is refused
      with :class:`StoreSchemaError`.
    - Values are JSON (a value that is not raises ``TypeError`` before anything is
      written); notes carry a per-namespace ``seq`` from 1, a timestamp and JSON metadata.

    The file is opened lazily on first use (or with ``await store.open()`` /
    ``async with store:``); ``aclose()`` closes it for good.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError("path", path, "a file path (str or os.PathLike)", owner="SqliteStore")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError("timeout", timeout, "a number of seconds > 0", owner="SqliteStore")
        self.path: str = os.fspath(path)
        self.timeout = float(timeout)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._limiter: tuple[object, anyio.CapacityLimiter] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._conn is not None else "unopened"
        return f"<SqliteStore {self.path!r} {state}>"

    # -- plumbing ------------------------------------------------------------------------

    def _loop_limiter(self) -> anyio.CapacityLimiter:
        # one worker thread per store and event loop: waiting callers wait on the loop,
        # not in (and not exhausting) the shared thread pool
        token = anyio.lowlevel.current_token()
        cached = self._limiter
        if cached is None or cached[0] != token:
            cached = self._limiter = (token, anyio.CapacityLimiter(1))
        return cached[1]

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await anyio.to_thread.run_sync(self._call, fn, limiter=self._loop_limiter())

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise StoreClosed(f"{self!r} was closed")
            conn = self._conn if self._conn is not None else self._connect()
            return fn(conn)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            _enable_wal(conn, self.timeout)
            conn.execute("PRAGMA synchronous=NORMAL")
            _migrate(conn, self.path)
        except sqlite3.OperationalError:
            conn.close()  # cannot open the file, or busy past the timeout: as SQLite says
            raise
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

        await anyio.to_thread.run_sync(close, limiter=self._loop_limiter())

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
    ) -> list[Note]:
        """Append every text with consecutive ``seq`` values in one transaction."""
        items = _note_texts(texts)
        if not items:
            return []
        meta = _encode(metadata or {}, "note metadata")
        return await self._run(lambda conn: _append(conn, namespace, items, meta))

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; with ``limit``, only the newest ``limit`` of them."""
        _check_limit(limit)

        def notes(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            columns = "SELECT seq, text, created_at, metadata FROM tinyctx_notes"
            if not limit:
                query = f"{columns} WHERE namespace = ? ORDER BY seq"
                return conn.execute(query, (namespace,)).fetchall()
            query = f"{columns} WHERE namespace = ? ORDER BY seq DESC LIMIT ?"
            return conn.execute(query, (namespace, limit)).fetchall()[::-1]

        rows = await self._run(notes)
        return [_note_from_row(namespace, row) for row in rows]
