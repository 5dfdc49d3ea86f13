"""The SQLite store's file: its schema and migrations, its transactions (write, read),
the WAL switch and the checks that refuse rows or files this release cannot read.

Every function here runs in the store's worker thread with its one connection.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any, Final

from ..store_errors import StoreSchemaError

__all__ = [
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "StoreConnection",
    "Immediate",
    "Read",
    "stored_version",
    "migrate",
    "enable_wal",
    "check_integers",
    "BUSY_SLICE",
    "busy",
    "AUTOCHECKPOINT_PAGES",
    "inline_mode",
    "thread_mode",
]


SCHEMA_VERSION = 7
"""The schema version :class:`SqliteStore` writes; older files are migrated on open."""

# MIGRATIONS[n] takes a file from version n to version n + 1, inside one transaction.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
    # 6: a thread's own TTL (tinyctx.lifecycle; NULL: the store's ttl=), counted from
    # updated_at, its last write; and, for each version, the run that made it and the
    # checkpoint and layer state it set (tinyctx.versions; NULL: unchanged, or before)
    (
        "ALTER TABLE tinyctx_threads ADD COLUMN ttl REAL",
        "ALTER TABLE tinyctx_versions ADD COLUMN run_id TEXT",
        "ALTER TABLE tinyctx_versions ADD COLUMN checkpoint_set INTEGER",
        "ALTER TABLE tinyctx_versions ADD COLUMN checkpoint TEXT",
        "ALTER TABLE tinyctx_versions ADD COLUMN state TEXT",
    ),
    # 7: the layer state is stored once, in the version log's row of the write that set
    # it: the thread row names that version (state_version) and holds NULL state; NULL
    # state_version: the state is the thread row's own (rows written before)
    ("ALTER TABLE tinyctx_threads ADD COLUMN state_version INTEGER",),
)
assert len(MIGRATIONS) == SCHEMA_VERSION


class StoreConnection(sqlite3.Connection):
    """A store's connection: its file's path and the schema cookie (SQLite's
    ``schema_version``, changed by every schema change) it last found at this release's
    schema version."""

    path = ""
    schema_cookie: int | None = None
    # small writes made on the event loop (SqliteStore.write): whether this connection's
    # sync mode allows them (None: not asked yet), and whether it is set up for them now
    # (no busy wait, no checkpoint at commit: both stay on the store's thread)
    inline_allowed: bool | None = None
    inline_mode = False


def _check_schema(conn: sqlite3.Connection) -> None:
    """Inside a transaction: refuse a file another process migrated past this release's
    schema while this connection was open (its rows may be in a layout this code misreads).
    One pragma when nothing changed."""
    if not isinstance(conn, StoreConnection) or conn.schema_cookie is None:
        return  # migrating on open, or not a store's connection
    (cookie,) = conn.execute("PRAGMA schema_version").fetchone()
    if cookie == conn.schema_cookie:
        return
    version = stored_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"{conn.path}: migrated to schema version {version} by a newer tinyctx while "
            f"this store had it open (this one reads up to version {SCHEMA_VERSION}); run "
            "this process on the newer release"
        )
    conn.schema_cookie = cookie


class Immediate:
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


def stored_version(conn: sqlite3.Connection) -> int:
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tinyctx_schema'"
    ).fetchone()
    if has_table is None:
        return 0
    row = conn.execute("SELECT version FROM tinyctx_schema WHERE id = 1").fetchone()
    return int(row[0]) if row is not None else 0


def migrate(conn: sqlite3.Connection, path: str) -> None:
    version = stored_version(conn)
    if version == SCHEMA_VERSION:
        return
    with Immediate(conn):
        # re-read under the write lock: another process may have migrated meanwhile
        version = stored_version(conn)
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
            for statement in MIGRATIONS[number]:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO tinyctx_schema (id, version, updated_at) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
            "updated_at = excluded.updated_at",
            (SCHEMA_VERSION, time.time()),
        )


def enable_wal(conn: sqlite3.Connection, timeout: float) -> None:
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


class Read:
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


_SQLITE_KINDS: Final = {bytes: "a BLOB", str: "text", float: "a REAL", type(None): "NULL"}


def check_integers(
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


BUSY_SLICE = 0.05
"""SQLite's own busy wait, in seconds: a call waiting for another writer's lock retries in
slices this long until the store's ``timeout``, so a cancelled caller's call gives up
within one slice (SQLite's busy handler heeds no interrupt)."""


def busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (another connection's lock)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or (
        code is None and "locked" in str(exc)
    )


# -- small writes on the event loop (SqliteStore.write) ------------------------------------

_SYNC_NORMAL: Final = 1
"""``PRAGMA synchronous``'s NORMAL: in WAL mode a commit only writes to the WAL file (the
OS's page cache), with no fsync; FULL (2) and EXTRA (3) fsync at every commit."""

AUTOCHECKPOINT_PAGES: Final = 1000
"""SQLite's default ``wal_autocheckpoint``: the WAL's size at which a commit made on the
store's thread folds it back into the database file."""


def inline_mode(conn: sqlite3.Connection) -> bool:
    """Set ``conn`` up for a write on the event loop, if its sync mode allows one (a
    commit then waits for no disk): no busy wait (a locked file is left to the store's
    thread, which waits for it) and no checkpoint at commit (the store's thread runs
    them). False: this connection's writes all go to the store's thread."""
    if not isinstance(conn, StoreConnection):
        return False
    allowed = conn.inline_allowed
    if allowed is None:
        (mode,) = conn.execute("PRAGMA synchronous").fetchone()
        allowed = conn.inline_allowed = int(mode) <= _SYNC_NORMAL
    if allowed and not conn.inline_mode:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.inline_mode = True
    return allowed


def thread_mode(conn: sqlite3.Connection) -> None:
    """Set ``conn`` back up for a call on the store's thread: the busy wait in slices of
    :data:`BUSY_SLICE`, and a checkpoint at the commit that finds the WAL grown past
    :data:`AUTOCHECKPOINT_PAGES`."""
    if isinstance(conn, StoreConnection) and conn.inline_mode:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE * 1000)}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
        conn.inline_mode = False
