"""PostgresStore: Store and ThreadStore on PostgreSQL, for many workers on many machines.

Needs the ``postgres`` extra (psycopg 3 and psycopg_pool): ``pip install 'tinyctx[postgres]'``.

Layout (all inside one schema, ``tinyctx`` unless ``schema=`` says otherwise; created and
migrated on open under an advisory lock, so many workers may open it at once):

- ``kv``, ``notes``, ``note_seq``: the :class:`~tinyctx.stores.Store` data;
- ``threads`` (version, length, checkpoint, state), ``messages`` (one row per live message,
  by position), ``archive`` (what compactions replaced), ``leases`` (one row per thread:
  owner, fencing token, expiry) and the sequence ``fencing`` for tokens;
- the functions ``write_thread``, ``acquire_lease`` and ``delete_thread``: each change is one
  statement and so one transaction, and the fencing check, the version check and the write
  happen in it together, under the thread's row lock.

Lease expiry is judged by the database server's clock, so workers' clocks need not agree.
Documents and note texts are stored as UTF-8 ``bytea`` (PostgreSQL ``text`` cannot hold
NUL, which a Python string may); identifiers (namespaces, keys, thread ids, owners) are
``text`` with the "C" collation, so they sort by code point as in SQLite and Python.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from ..config import text
from ..errors import ConfigError
from ..lifecycle import check_store_ttl
from ..store_errors import StoreSchemaError, StoreUnavailable
from ..store_protocols import (
    Note,
    check_archive_retention,
    check_fence,
    check_lease,
    check_notes_limit,
    encode_json,
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
from ._common import (
    NetworkedStore,
    WorkerThreads,
    cancelled,
    check_positive,
    missing_extra,
    redact_url,
    stoppable,
)
from ._postgres_expiry import PostgresExpiry
from ._postgres_lifecycle import PostgresLifecycle
from ._postgres_schema import MIGRATIONS, SCHEMA_VERSION, Statements, check_schema, lock_key
from ._postgres_wire import dropped, login_refused, reason, shut_down, where

try:
    import psycopg
    import psycopg_pool
    from psycopg import conninfo as _conninfo
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

__all__ = ["PostgresStore", "SCHEMA_VERSION"]

T = TypeVar("T")
_Undo = Callable[[Any, list[tuple[Any, ...]]], object]

_UNSET = 0
_SET = 1


def _check_not_newer(schema: str, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"PostgreSQL schema {schema!r}: version {version} was written by a newer "
            f"tinyctx (this one reads up to version {SCHEMA_VERSION})"
        )


def _check_text(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} {value!r} contains NUL, which PostgreSQL text cannot hold")
    return value


def _docs(docs: Sequence[str]) -> list[bytes]:
    return [doc.encode() for doc in docs]


def _text(raw: bytes | memoryview | None) -> str | None:
    return None if raw is None else bytes(raw).decode()


_URL: Final = text(allowed="a PostgreSQL connection URL (str)")


class PostgresStore(PostgresExpiry, PostgresLifecycle, NetworkedStore):
    """:class:`~tinyctx.stores.Store` and :class:`~tinyctx.threads.ThreadStore` on PostgreSQL.

    ``url`` is a libpq connection URL or string (``postgresql://user:pass@host:5432/db``).
    Options:

    - ``schema``: the schema holding tinyctx's tables (created on open); applications or
      tenants that must not see each other use different schemas;
    - ``pool_size``: connections in the pool, and calls in flight at once per event loop;
    - ``timeout``: the connect timeout in seconds when the URL sets no ``connect_timeout``
      (the URL's wins): opening the store, and waiting for a pooled connection, give up
      after it with :class:`~tinyctx.stores.StoreUnavailable` naming the host and port;
    - ``archive_retention``: seconds compacted-away originals stay readable through
      :meth:`archived`; None keeps them until the thread is deleted;
    - ``ttl``: seconds a thread lives after its last write (None: forever; a thread's own
      TTL, :func:`~tinyctx.retention.set_thread_ttl`, wins). An expired thread reads as
      absent at once; schedule :func:`~tinyctx.retention.sweep_expired` to remove its rows.

    Calls run on psycopg's sync driver in worker threads (its async one is asyncio-only), so
    the store serves trio and asyncio alike; each answers a cancellation at once (see
    :class:`~tinyctx.backends._common.WorkerThreads`). The pool opens (and the schema is
    migrated) on first use, or with ``await store.open()`` / ``async with store:``.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "tinyctx",
        pool_size: int = 4,
        timeout: float = 30.0,
        archive_retention: float | None = None,
        ttl: float | None = None,
    ) -> None:
        owner = "PostgresStore"
        if _MISSING is not None:
            raise missing_extra(owner, "psycopg 3 and psycopg_pool", "postgres", _MISSING)
        _URL.check(url, "url", owner)
        try:
            _conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            # libpq's message may quote a piece of the string, a password's among them
            raise ConfigError(
                "url",
                redact_url(url),
                "a PostgreSQL connection URL or libpq key=value string that libpq can parse",
                owner=owner,
            ) from None
        self._schema_sql = check_schema(schema)
        check_positive(owner, "pool_size", pool_size, integer=True)
        check_positive(owner, "timeout", timeout)
        self.url = url
        self.schema = schema
        self.pool_size = pool_size
        self.timeout = float(timeout)
        self.archive_retention = check_archive_retention(archive_retention, owner)
        self.ttl = check_store_ttl(ttl, owner)
        self._sql = Statements(self._schema_sql)
        self.address, self.connect_timeout = where(url, self.timeout)
        self._threads: WorkerThreads[psycopg_pool.ConnectionPool[Any]] = WorkerThreads(
            self.__repr__,
            pool_size,
            self._connect,
            lambda pool: pool.close(),
            connect_timeout=self.connect_timeout,
            address=self.address,
        )

    def __repr__(self) -> str:
        state = self._threads.state
        return f"<PostgresStore {redact_url(self.url)} schema={self.schema} {state}>"

    # -- plumbing ------------------------------------------------------------------------

    def _connect(self) -> psycopg_pool.ConnectionPool[Any]:
        params = _conninfo.conninfo_to_dict(self.url)
        options: dict[str, Any] = {"autocommit": True}
        if "application_name" not in params:
            # what a DBA sees in pg_stat_activity (the URL's own name wins)
            options["application_name"] = f"tinyctx-{self.schema}"
        if "connect_timeout" not in params:
            # libpq takes whole seconds (and at least 2); the event loop side holds the
            # exact figure (WorkerThreads)
            options["connect_timeout"] = max(2, math.ceil(self.connect_timeout))
        # one connection first: its failure is the server's own reason (refused, no
        # answer, a wrong password), where the pool would only say PoolTimeout
        try:
            probe = psycopg.connect(self.url, **options)
        except psycopg.errors.ConnectionTimeout as exc:
            raise self._unavailable(
                f"no answer within the connect timeout of {self.connect_timeout:g}s"
            ) from exc
        except psycopg.OperationalError as exc:
            # a login the server refused is no outage: retrying does not help
            refused = login_refused(exc)
            if refused is not None:
                raise refused from None
            raise self._unavailable(reason(exc, params.get("password"))) from exc
        with probe:
            self._migrate(probe)
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=self.connect_timeout,
            kwargs=options,
            name=f"tinyctx-{self.schema}",
        )
        try:
            pool.open(wait=True, timeout=self.connect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise self._unavailable(
                f"no connection within the connect timeout of {self.connect_timeout:g}s"
            ) from exc
        except BaseException:
            pool.close()
            raise
        return pool

    def _unavailable(self, reason: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"{self!r}: PostgreSQL at {self.address} is unavailable: {reason}",
            address=self.address,
        )

    async def _run(
        self,
        fn: Callable[[psycopg_pool.ConnectionPool[Any]], T],
        undo: Callable[[psycopg_pool.ConnectionPool[Any], T], object] | None = None,
    ) -> T:
        """``fn(pool)`` in a worker thread; a pool that found no connection within the
        connect timeout (the server went away, or stopped answering) is StoreUnavailable."""
        try:
            return await self._threads.run(fn, undo=undo)
        except psycopg_pool.PoolTimeout as exc:
            raise self._unavailable(
                f"no connection within the connect timeout of {self.connect_timeout:g}s ({exc})"
            ) from exc

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        s = self._schema_sql
        # a current schema opens without DDL, so a role with only data rights (SELECT,
        # INSERT, UPDATE, DELETE, EXECUTE) may use one its owner created and migrated
        with conn.transaction():
            found = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (f"{s}.schema_version",)
            ).fetchone()
            if found is not None and found[0]:
                row = conn.execute(f"SELECT version FROM {s}.schema_version").fetchone()
                if row is not None:
                    _check_not_newer(self.schema, int(row[0]))
                    if int(row[0]) == SCHEMA_VERSION:
                        return
        try:
            self._migrate_now(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreSchemaError(
                f"PostgreSQL schema {self.schema!r} must be created or migrated to version "
                f"{SCHEMA_VERSION}, and this role may not ({exc}); open the store once as a "
                "role that owns the schema (or may create it), then this role can use it"
            ) from None

    def _migrate_now(self, conn: psycopg.Connection[Any]) -> None:
        s = self._schema_sql
        with conn.transaction():
            # one migrator per schema at a time, across every process
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema),))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.schema_version (id integer PRIMARY KEY "
                "CHECK (id = 1), version integer NOT NULL, updated_at float8 NOT NULL)"
            )
            row = conn.execute(f"SELECT version FROM {s}.schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            _check_not_newer(self.schema, version)
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]:
                    conn.execute(statement.replace("{s}", s))
            if version != SCHEMA_VERSION:
                conn.execute(
                    f"INSERT INTO {s}.schema_version (id, version, updated_at) "
                    "VALUES (1, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                    "version = excluded.version, updated_at = excluded.updated_at",
                    (SCHEMA_VERSION, time.time()),
                )

    async def _fetchone(
        self, query: str, params: Sequence[Any], *, once: bool = False, undo: _Undo | None = None
    ) -> tuple[Any, ...] | None:
        rows = await self._fetchall(query, params, once=once, first=True, undo=undo)
        return rows[0] if rows else None

    async def _fetchall(
        self,
        query: str,
        params: Sequence[Any],
        *,
        once: bool = False,
        first: bool = False,
        undo: _Undo | None = None,
    ) -> list[tuple[Any, ...]]:
        """The statement's rows (only the first when ``first``). A pooled connection the
        server dropped (a restart, a failover: the pool finds out only by using it) fails
        the statement before it ran, and a statement that is safe to repeat runs once more
        on a fresh connection; ``once`` marks one that is not (an append, a delete whose
        count is returned), whose caller gets the error."""

        def attempt(pool: psycopg_pool.ConnectionPool[Any]) -> list[tuple[Any, ...]]:
            with pool.connection() as conn, stoppable(lambda: shut_down(conn), conn.close):
                cursor = conn.execute(query, params, binary=True)
                if first:
                    row: tuple[Any, ...] | None = cursor.fetchone()
                    return [] if row is None else [row]
                rows: list[tuple[Any, ...]] = cursor.fetchall()
                return rows

        def run(pool: psycopg_pool.ConnectionPool[Any]) -> list[tuple[Any, ...]]:
            try:
                return attempt(pool)
            except psycopg.OperationalError as exc:
                if once or not dropped(exc) or cancelled():
                    raise
            # the server dropped the others too: let the pool find them before the retry
            pool.check()
            return attempt(pool)

        return await self._run(run, undo)

    # -- lifecycle -----------------------------------------------------------------------

    async def schema_version(self) -> int:
        """The schema version in the database (:data:`SCHEMA_VERSION` once open)."""
        row = await self._fetchone(f"SELECT version FROM {self._schema_sql}.schema_version", ())
        return 0 if row is None else int(row[0])

    # -- key/value -----------------------------------------------------------------------

    async def get(self, namespace: str, key: str) -> Any | None:
        row = await self._fetchone(
            self._sql.get, (_check_text("namespace", namespace), _check_text("key", key))
        )
        return None if row is None else json.loads(row[0])

    async def put(self, namespace: str, key: str, value: Any) -> None:
        params = (_check_text("namespace", namespace), _check_text("key", key))
        encoded = encode_json(value, f"the value of {namespace!r}/{key!r}", owner="PostgresStore")
        await self._fetchall(self._sql.put, (*params, encoded, time.time()))

    async def delete(self, namespace: str, key: str) -> bool:
        rows = await self._fetchall(
            self._sql.delete, (_check_text("namespace", namespace), _check_text("key", key))
        )
        return bool(rows)

    async def keys(self, namespace: str) -> list[str]:
        rows = await self._fetchall(self._sql.keys, (_check_text("namespace", namespace),))
        return [str(row[0]) for row in rows]

    # -- notes ---------------------------------------------------------------------------

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> list[Note]:
        """Append every text with consecutive ``seq`` values in one statement; with
        ``fence``, in one transaction that first checks (and share-locks, as a thread
        write does) that it is its thread's newest lease, else :class:`FencedOut`."""
        items = note_texts(texts)
        _check_text("namespace", namespace)
        check_fence(fence)
        if not items:
            return []
        meta = encode_json(metadata or {}, "note metadata", owner="PostgresStore")
        now = time.time()
        params = (namespace, len(items), now, meta, _docs(items))
        if fence is None:
            rows = await self._fetchall(self._sql.append_notes, params, once=True)
        else:
            rows = await self._fenced_append(fence, params)
        first = int(rows[0][0])
        decoded = json.loads(meta)
        return [
            Note(namespace, first + index, text, now, decoded) for index, text in enumerate(items)
        ]

    async def _fenced_append(self, fence: Lease, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        thread_id = fence.thread_id

        def run(pool: psycopg_pool.ConnectionPool[Any]) -> list[tuple[Any, ...]]:
            with (
                pool.connection() as conn,
                stoppable(lambda: shut_down(conn), conn.close),
                conn.transaction(),
            ):
                row = conn.execute(self._sql.lease_token_share, (thread_id,)).fetchone()
                token = None if row is None else int(row[0])
                if token != fence.token:
                    raise FencedOut(thread_id, fence.token, token)
                rows: list[tuple[Any, ...]] = conn.execute(
                    self._sql.append_notes, params, binary=True
                ).fetchall()
                return rows

        return await self._run(run)

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; with ``limit``, only the newest ``limit`` of them."""
        check_notes_limit(limit)
        _check_text("namespace", namespace)
        if limit == 0:
            return []
        if limit:
            rows = await self._fetchall(self._sql.notes_newest, (namespace, limit))
            rows.reverse()
        else:
            rows = await self._fetchall(self._sql.notes, (namespace,))
        return [
            Note(namespace, int(seq), bytes(text).decode(), float(at), json.loads(meta))
            for seq, text, at, meta in rows
        ]

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace`` (its ``seq`` starts at 1 again); how many."""
        _check_text("namespace", namespace)
        row = await self._fetchone(self._sql.delete_notes, (namespace, namespace), once=True)
        return 0 if row is None else int(row[0])

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now, read in one statement (one consistent snapshot)."""
        row = await self._fetchone(
            self._sql.load, (self.ttl, time.time(), check_thread_id(thread_id))
        )
        assert row is not None
        version, checkpoint, state, owner, token, expires_at, docs, expired = row
        if expired:  # not swept yet: absent
            return ThreadRecord(thread_id, 0, ())
        lease = None
        if token is not None:
            lease = Lease(thread_id, str(owner), int(token), float(expires_at))
        return ThreadRecord(
            thread_id,
            0 if version is None else int(version),
            tuple(bytes(doc).decode() for doc in docs),
            _text(checkpoint),
            _text(state),
            lease,
        )

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """Apply ``change`` in one transaction: fencing, version and range checks first."""
        validate_write(thread_id, change, expected_version, lease)
        compaction = change.compaction
        now = time.time()
        keep_after = None if self.archive_retention is None else now - self.archive_retention
        checkpoint = change.checkpoint
        params = (
            self.ttl,
            change.run_id,
            thread_id,
            expected_version,
            None if lease is None else lease.token,
            None if compaction is None else compaction.start,
            None if compaction is None else compaction.end,
            [] if compaction is None else _docs(compaction.replacement),
            _docs(change.append),
            not isinstance(checkpoint, Unchanged),
            checkpoint.encode() if isinstance(checkpoint, str) else None,
            not isinstance(change.state, Unchanged),
            None if isinstance(change.state, Unchanged) else change.state.encode(),
            now,
            keep_after,
        )
        row = await self._fetchone(self._sql.write, params, once=True)
        assert row is not None
        outcome, figure = row
        if outcome == "ok":
            return int(figure)
        if outcome == "fenced":
            assert lease is not None
            raise FencedOut(thread_id, lease.token, None if figure is None else int(figure))
        if outcome == "stale":
            # a first write that lost to another first write, whose row a delete_thread
            # removed again before it was read back: the thread is at version 0 again
            actual = 0 if figure is None else int(figure)
            raise StaleThreadVersion(thread_id, expected_version, actual)
        check_write_range(thread_id, change, int(figure))
        raise AssertionError(f"write_thread returned {outcome!r}")  # pragma: no cover

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        validate_lease_request(thread_id, owner, ttl)
        seconds, now = float(ttl), time.time()

        def release(pool: psycopg_pool.ConnectionPool[Any], rows: list[tuple[Any, ...]]) -> None:
            if rows and rows[0][0]:  # granted to a caller that was cancelled meanwhile
                with pool.connection() as conn:
                    conn.execute(self._sql.release, (thread_id, int(rows[0][2])))

        row = await self._fetchone(
            self._sql.acquire,
            (check_thread_id(thread_id), _check_text("owner", owner), seconds, self.ttl, now),
            undo=release,
        )
        if row is None:  # released between the upsert and the read: try again
            return await self.acquire_lease(thread_id, owner, ttl)
        granted, holder, token, expires_at = row
        if not granted:
            raise LeaseHeld(thread_id, str(holder), float(expires_at))
        return Lease(thread_id, owner, int(token), float(expires_at))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        validate_lease_request(check_lease(lease, "renew_lease").thread_id, lease.owner, ttl)
        seconds = float(ttl)
        rows = await self._fetchall(self._sql.renew, (seconds, lease.thread_id, lease.token))
        if not rows:
            current = await self._fetchone(self._sql.lease_token, (lease.thread_id,))
            raise FencedOut(lease.thread_id, lease.token, None if current is None else current[0])
        return Lease(lease.thread_id, lease.owner, lease.token, float(rows[0][0]))

    async def release_lease(self, lease: Lease) -> None:
        await self._fetchall(
            self._sql.release, (check_lease(lease, "release_lease").thread_id, lease.token)
        )

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        check_notes_limit(limit)
        rows = await self._fetchall(
            self._sql.list, (check_thread_id(prefix, field="prefix"), self.ttl, time.time(), limit)
        )
        return [str(row[0]) for row in rows]

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        keep_after = (
            None if self.archive_retention is None else time.time() - self.archive_retention
        )
        expiry = (thread_id, self.ttl, time.time())
        rows = await self._fetchall(
            self._sql.archived, (check_thread_id(thread_id), keep_after, keep_after, *expiry)
        )
        return [
            ArchivedRange(
                thread_id,
                int(version),
                int(start),
                int(end),
                tuple(bytes(doc).decode() for doc in docs),
                float(at),
            )
            for version, start, end, docs, at in rows
        ]

    async def delete_thread(self, thread_id: str) -> bool:
        row = await self._fetchone(
            self._sql.delete_thread, (check_thread_id(thread_id),), once=True
        )
        return bool(row is not None and row[0])
