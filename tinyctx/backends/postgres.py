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
import os
import re
import socket
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError
from ..stores import (
    Note,
    StoreAuthenticationFailed,
    StoreSchemaError,
    StoreUnavailable,
    _check_limit,
    _encode,
    _note_texts,
    _retention,
    check_fence,
    check_lease,
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
from ._postgres_lifecycle import PostgresLifecycle, versions_migration

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

SCHEMA_VERSION = 4
"""The schema version :class:`PostgresStore` writes; an older schema is migrated on open."""

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SCHEMA_RULE = (
    "a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 characters) that is not a "
    "system schema (pg_*, information_schema)"
)


def check_schema(schema: object) -> str:
    """``schema`` quoted for SQL (``"name"``), or a ConfigError naming what is allowed.

    Quoted, a reserved word (``user``, ``select``) is a schema like any other; the system
    schemas (``pg_catalog``, ``pg_toast``, every ``pg_*``, ``information_schema``) are
    refused, so a store never creates or writes tables among the server's own."""
    if (
        not isinstance(schema, str)
        or not _IDENTIFIER.fullmatch(schema)
        or schema.startswith("pg_")
        or schema == "information_schema"
    ):
        raise ConfigError("schema", schema, _SCHEMA_RULE, owner="PostgresStore")
    return f'"{schema}"'


# _MIGRATIONS[n] takes a schema from version n to n + 1, in one transaction; `{s}` is the
# schema's name
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        'CREATE TABLE {s}.kv (namespace text COLLATE "C" NOT NULL, key text COLLATE "C" '
        "NOT NULL, value text NOT NULL, updated_at float8 NOT NULL, "
        "PRIMARY KEY (namespace, key))",
        'CREATE TABLE {s}.note_seq (namespace text COLLATE "C" PRIMARY KEY, last bigint NOT NULL)',
        'CREATE TABLE {s}.notes (namespace text COLLATE "C" NOT NULL, seq bigint NOT NULL, '
        "text bytea NOT NULL, created_at float8 NOT NULL, metadata text NOT NULL, "
        "PRIMARY KEY (namespace, seq))",
        'CREATE TABLE {s}.threads (thread_id text COLLATE "C" PRIMARY KEY, '
        "version bigint NOT NULL, length integer NOT NULL, checkpoint bytea, state bytea, "
        "updated_at float8 NOT NULL)",
        # deferred: a compaction shifts positions, which collide until the statement ends
        'CREATE TABLE {s}.messages (thread_id text COLLATE "C" NOT NULL, '
        "pos integer NOT NULL, doc bytea NOT NULL, "
        "PRIMARY KEY (thread_id, pos) DEFERRABLE INITIALLY DEFERRED)",
        "CREATE TABLE {s}.archive (id bigserial PRIMARY KEY, "
        'thread_id text COLLATE "C" NOT NULL, version bigint NOT NULL, '
        "start_pos integer NOT NULL, end_pos integer NOT NULL, messages bytea[] NOT NULL, "
        "archived_at float8 NOT NULL)",
        "CREATE INDEX ON {s}.archive (thread_id, id)",
        'CREATE TABLE {s}.leases (thread_id text COLLATE "C" PRIMARY KEY, '
        "owner text NOT NULL, token bigint NOT NULL, expires_at float8 NOT NULL)",
        "CREATE SEQUENCE {s}.fencing",
        # one write: fencing, then version, then range; then compaction (archived), append,
        # checkpoint and state. Returns ('ok', new version) or the refusal and its figure.
        """
CREATE FUNCTION {s}.write_thread(
    p_thread text, p_expected bigint, p_token bigint, p_start integer, p_end integer,
    p_replacement bytea[], p_append bytea[], p_set_checkpoint boolean, p_checkpoint bytea,
    p_set_state boolean, p_state bytea, p_now float8, p_keep_after float8
) RETURNS TABLE (outcome text, figure bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_version bigint;
    v_length integer;
    v_current bigint;
    v_found boolean;
    v_shift integer;
    v_new bigint;
BEGIN
    SELECT t.version, t.length INTO v_version, v_length
        FROM {s}.threads t WHERE t.thread_id = p_thread FOR UPDATE;
    v_found := FOUND;
    IF NOT v_found THEN
        v_version := 0;
        v_length := 0;
    END IF;
    IF p_token IS NOT NULL THEN
        SELECT l.token INTO v_current FROM {s}.leases l WHERE l.thread_id = p_thread FOR SHARE;
        IF v_current IS DISTINCT FROM p_token THEN
            RETURN QUERY SELECT 'fenced'::text, v_current;
            RETURN;
        END IF;
    END IF;
    IF v_version <> p_expected THEN
        RETURN QUERY SELECT 'stale'::text, v_version;
        RETURN;
    END IF;
    IF p_start IS NOT NULL AND NOT (0 <= p_start AND p_start <= p_end AND p_end <= v_length)
    THEN
        RETURN QUERY SELECT 'range'::text, v_length::bigint;
        RETURN;
    END IF;
    IF NOT v_found THEN
        INSERT INTO {s}.threads (thread_id, version, length, updated_at)
            VALUES (p_thread, 0, 0, p_now) ON CONFLICT (thread_id) DO NOTHING;
        IF NOT FOUND THEN
            -- another first write committed meanwhile
            SELECT t.version INTO v_version FROM {s}.threads t WHERE t.thread_id = p_thread;
            RETURN QUERY SELECT 'stale'::text, v_version;
            RETURN;
        END IF;
    END IF;
    v_new := v_version + 1;
    IF p_start IS NOT NULL THEN
        v_shift := cardinality(p_replacement) - (p_end - p_start);
        IF p_end > p_start THEN
            INSERT INTO {s}.archive (thread_id, version, start_pos, end_pos, messages,
                                     archived_at)
                VALUES (p_thread, v_new, p_start, p_end, ARRAY(
                    SELECT m.doc FROM {s}.messages m
                    WHERE m.thread_id = p_thread AND m.pos >= p_start AND m.pos < p_end
                    ORDER BY m.pos), p_now);
        END IF;
        DELETE FROM {s}.messages m
            WHERE m.thread_id = p_thread AND m.pos >= p_start AND m.pos < p_end;
        IF v_shift <> 0 THEN
            UPDATE {s}.messages m SET pos = m.pos + v_shift
                WHERE m.thread_id = p_thread AND m.pos >= p_end;
        END IF;
        INSERT INTO {s}.messages (thread_id, pos, doc)
            SELECT p_thread, p_start + r.ord - 1, r.doc
            FROM unnest(p_replacement) WITH ORDINALITY AS r(doc, ord);
        v_length := v_length + v_shift;
        IF p_keep_after IS NOT NULL THEN
            DELETE FROM {s}.archive a
                WHERE a.thread_id = p_thread AND a.archived_at < p_keep_after;
        END IF;
    END IF;
    INSERT INTO {s}.messages (thread_id, pos, doc)
        SELECT p_thread, v_length + a.ord - 1, a.doc
        FROM unnest(p_append) WITH ORDINALITY AS a(doc, ord);
    v_length := v_length + cardinality(p_append);
    UPDATE {s}.threads t SET version = v_new, length = v_length,
        checkpoint = CASE WHEN p_set_checkpoint THEN p_checkpoint ELSE t.checkpoint END,
        state = CASE WHEN p_set_state THEN p_state ELSE t.state END,
        updated_at = p_now
        WHERE t.thread_id = p_thread;
    RETURN QUERY SELECT 'ok'::text, v_new;
END
$$""",
        # a new lease unless another owner's is live; the upsert's WHERE runs under the row
        # lock, so two acquirers never both win
        """
CREATE FUNCTION {s}.acquire_lease(p_thread text, p_owner text, p_ttl float8)
RETURNS TABLE (granted boolean, owner text, token bigint, expires_at float8)
LANGUAGE plpgsql AS $$
DECLARE
    v_now float8 := extract(epoch FROM clock_timestamp());
    v_token bigint;
    v_expires float8;
BEGIN
    INSERT INTO {s}.leases AS l (thread_id, owner, token, expires_at)
        VALUES (p_thread, p_owner, nextval('{s}.fencing'), v_now + p_ttl)
        ON CONFLICT (thread_id) DO UPDATE
            SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
            WHERE l.owner = excluded.owner OR l.expires_at <= v_now
        RETURNING l.token, l.expires_at INTO v_token, v_expires;
    IF FOUND THEN
        RETURN QUERY SELECT true, p_owner, v_token, v_expires;
        RETURN;
    END IF;
    RETURN QUERY SELECT false, l.owner, l.token, l.expires_at
        FROM {s}.leases l WHERE l.thread_id = p_thread;
END
$$""",
        # the thread row first (waiting for a writer that holds it), then the rest, each
        # statement with a fresh snapshot: rows that writer added are deleted too
        """
CREATE FUNCTION {s}.delete_thread(p_thread text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_found boolean;
BEGIN
    DELETE FROM {s}.threads t WHERE t.thread_id = p_thread;
    v_found := FOUND;
    DELETE FROM {s}.messages m WHERE m.thread_id = p_thread;
    DELETE FROM {s}.archive a WHERE a.thread_id = p_thread;
    DELETE FROM {s}.leases l WHERE l.thread_id = p_thread;
    RETURN v_found OR FOUND;
END
$$""",
    ),
    # 2: delete_thread locks the thread's row even when there is none yet (a placeholder
    # row, deleted again): a first write racing the delete can no longer have its
    # messages deleted from under its version
    (
        """
CREATE OR REPLACE FUNCTION {s}.delete_thread(p_thread text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_found boolean;
    v_leased boolean;
BEGIN
    LOOP
        PERFORM 1 FROM {s}.threads t WHERE t.thread_id = p_thread FOR UPDATE;
        IF FOUND THEN
            v_found := true;
            EXIT;
        END IF;
        INSERT INTO {s}.threads (thread_id, version, length, updated_at)
            VALUES (p_thread, 0, 0, 0) ON CONFLICT (thread_id) DO NOTHING;
        IF FOUND THEN
            v_found := false;
            EXIT;
        END IF;
    END LOOP;
    -- the row is locked: no write of this thread runs until the delete commits
    DELETE FROM {s}.messages m WHERE m.thread_id = p_thread;
    DELETE FROM {s}.archive a WHERE a.thread_id = p_thread;
    DELETE FROM {s}.leases l WHERE l.thread_id = p_thread;
    v_leased := FOUND;
    DELETE FROM {s}.threads t WHERE t.thread_id = p_thread;
    RETURN v_found OR v_leased;
END
$$""",
    ),
    # 3: documents are compressed with lz4 where the server has it (PostgreSQL 14+ built
    # with lz4, as Debian's and the official images are): a long thread decompresses in a
    # fraction of pglz's time, so a 2000-message load takes ~6 ms instead of ~8, for about
    # the same size on disk. Values written before stay as they are (both read back); a
    # server without lz4, or a role that may not alter the tables, keeps pglz. EXECUTE: an
    # older server parses the statement only when it runs, inside the handler.
    (
        """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {s}.messages ALTER COLUMN doc SET COMPRESSION lz4';
    EXECUTE 'ALTER TABLE {s}.threads ALTER COLUMN checkpoint SET COMPRESSION lz4, '
        'ALTER COLUMN state SET COMPRESSION lz4';
    EXECUTE 'ALTER TABLE {s}.archive ALTER COLUMN messages SET COMPRESSION lz4';
    EXECUTE 'ALTER TABLE {s}.notes ALTER COLUMN text SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error OR invalid_parameter_value
    OR insufficient_privilege THEN
    NULL;
END
$$""",
    ),
)
# 4: what each write did, for reading a thread as of an old version (tinyctx.versions)
_MIGRATIONS += (versions_migration(_MIGRATIONS[0][9], _MIGRATIONS[1][0]),)
assert len(_MIGRATIONS) == SCHEMA_VERSION

_UNSET = 0
_SET = 1


def _dropped(exc: BaseException) -> bool:
    """Whether ``exc`` says the server closed the connection (not a query's own error):
    the connection failed or was shut down by an administrator (a restart, a failover)."""
    if _MISSING is not None:  # pragma: no cover - no psycopg, no store
        return False
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return False
    return isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.ConnectionFailure) or (
        type(exc) is psycopg.OperationalError and "connection" in str(exc).lower()
    )


_LOGIN_REFUSED = re.compile(
    r"authentication failed|role \"[^\n]*\" does not exist|no pg_hba\.conf entry|"
    r"no password supplied"
)


def _login_refused(exc: psycopg.OperationalError) -> StoreAuthenticationFailed | None:
    """The error naming user, host and port when ``exc`` is a login the server refused;
    None for any other failure to connect."""
    text = str(exc)
    if not _LOGIN_REFUSED.search(text):
        return None
    pgconn = getattr(exc, "pgconn", None)

    def part(name: str) -> str:
        raw = getattr(pgconn, name, None) if pgconn is not None else None
        return raw.decode(errors="replace") if isinstance(raw, bytes) else "?"

    reason = text.rpartition("FATAL:")[2].strip() or text
    return StoreAuthenticationFailed(
        f"PostgreSQL at {part('host')}:{part('port')} refused the login of user "
        f"{part('user')!r} (authentication failed: {reason}); check the user, password "
        "and database in the store's URL"
    )


def _where(url: str, timeout: float) -> tuple[str, float]:
    """The server's ``host:port`` (for messages: never a password) and the connect
    timeout: the URL's ``connect_timeout`` when it sets a positive one, else ``timeout``."""
    params = _conninfo.conninfo_to_dict(url)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    address = f"{host}:{params.get('port') or 5432}"
    try:
        given = float(params.get("connect_timeout") or 0)
    except ValueError:
        given = 0.0
    return address, given if given > 0 and math.isfinite(given) else timeout


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """End whatever ``conn`` waits for: its socket is shut down (not closed: the driver
    still owns the descriptor), so the wait fails at once and the pool drops it."""
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _reason(exc: BaseException, password: object) -> str:
    """The driver's message, one line, without the password should it appear in it."""
    text = " ".join(str(exc).split())
    if isinstance(password, str) and password:
        text = text.replace(password, "***")
    return text


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


class PostgresStore(PostgresLifecycle, NetworkedStore):
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
      :meth:`archived`; None keeps them until the thread is deleted.

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
    ) -> None:
        owner = "PostgresStore"
        if _MISSING is not None:
            raise missing_extra(owner, "psycopg 3 and psycopg_pool", "postgres", _MISSING)
        if not isinstance(url, str) or not url:
            raise ConfigError("url", url, "a PostgreSQL connection URL (str)", owner=owner)
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
        self.archive_retention = _retention(archive_retention, owner)
        self._sql = _Statements(self._schema_sql)
        self.address, self.connect_timeout = _where(url, self.timeout)
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
            refused = _login_refused(exc)
            if refused is not None:
                raise refused from None
            raise self._unavailable(_reason(exc, params.get("password"))) from exc
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
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.schema_version (id integer PRIMARY KEY "
                "CHECK (id = 1), version integer NOT NULL, updated_at float8 NOT NULL)"
            )
            row = conn.execute(f"SELECT version FROM {s}.schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            _check_not_newer(self.schema, version)
            for number in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[number]:
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
            with pool.connection() as conn, stoppable(lambda: _shut_down(conn), conn.close):
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
                if once or not _dropped(exc) or cancelled():
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
        encoded = _encode(value, f"the value of {namespace!r}/{key!r}", owner="PostgresStore")
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
        items = _note_texts(texts)
        _check_text("namespace", namespace)
        check_fence(fence)
        if not items:
            return []
        meta = _encode(metadata or {}, "note metadata", owner="PostgresStore")
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
                stoppable(lambda: _shut_down(conn), conn.close),
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
        _check_limit(limit)
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
        row = await self._fetchone(self._sql.load, (check_thread_id(thread_id),))
        assert row is not None
        version, checkpoint, state, owner, token, expires_at, docs = row
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
        seconds = float(ttl)

        def release(pool: psycopg_pool.ConnectionPool[Any], rows: list[tuple[Any, ...]]) -> None:
            if rows and rows[0][0]:  # granted to a caller that was cancelled meanwhile
                with pool.connection() as conn:
                    conn.execute(self._sql.release, (thread_id, int(rows[0][2])))

        row = await self._fetchone(
            self._sql.acquire,
            (check_thread_id(thread_id), _check_text("owner", owner), seconds),
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
        _check_limit(limit)
        rows = await self._fetchall(
            self._sql.list, (check_thread_id(prefix, field="prefix"), limit)
        )
        return [str(row[0]) for row in rows]

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        keep_after = (
            None if self.archive_retention is None else time.time() - self.archive_retention
        )
        rows = await self._fetchall(
            self._sql.archived, (check_thread_id(thread_id), keep_after, keep_after)
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


def _lock_key(schema: str) -> int:
    """A stable advisory-lock key for migrating ``schema`` (a signed 64-bit integer)."""
    return zlib.crc32(f"tinyctx-migrate:{schema}".encode()) - 2**31


class _Statements:
    """Every statement of one schema, formatted once."""

    def __init__(self, s: str) -> None:
        self.get = f"SELECT value FROM {s}.kv WHERE namespace = %s AND key = %s"
        self.put = (
            f"INSERT INTO {s}.kv (namespace, key, value, updated_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
            "updated_at = excluded.updated_at RETURNING 1"
        )
        self.delete = f"DELETE FROM {s}.kv WHERE namespace = %s AND key = %s RETURNING 1"
        self.keys = f"SELECT key FROM {s}.kv WHERE namespace = %s ORDER BY key"
        # the counter row serializes appenders of one namespace; one statement, one commit
        self.append_notes = (
            f"WITH n AS (SELECT %s::text AS namespace, %s::bigint AS count, "
            f"%s::float8 AS at, %s::text AS meta), "
            f"s AS (INSERT INTO {s}.note_seq AS q (namespace, last) "
            f"SELECT namespace, count FROM n ON CONFLICT (namespace) DO UPDATE "
            f"SET last = q.last + excluded.last RETURNING q.last), "
            f"i AS (INSERT INTO {s}.notes (namespace, seq, text, created_at, metadata) "
            f"SELECT n.namespace, s.last - n.count + t.ord, t.text, n.at, n.meta "
            f"FROM n, s, unnest(%s::bytea[]) WITH ORDINALITY AS t(text, ord)) "
            f"SELECT s.last - n.count + 1 FROM n, s"
        )
        columns = f"SELECT seq, text, created_at, metadata FROM {s}.notes WHERE namespace = %s"
        self.notes = f"{columns} ORDER BY seq"
        self.notes_newest = f"{columns} ORDER BY seq DESC LIMIT %s"
        self.delete_notes = (
            f"WITH q AS (DELETE FROM {s}.note_seq WHERE namespace = %s), "
            f"d AS (DELETE FROM {s}.notes WHERE namespace = %s RETURNING 1) "
            "SELECT count(*) FROM d"
        )
        self.load = (
            f"SELECT t.version, t.checkpoint, t.state, l.owner, l.token, l.expires_at, "
            f"ARRAY(SELECT m.doc FROM {s}.messages m WHERE m.thread_id = k.id ORDER BY m.pos) "
            f"FROM (SELECT %s::text AS id) k "
            f"LEFT JOIN {s}.threads t ON t.thread_id = k.id "
            f"LEFT JOIN {s}.leases l ON l.thread_id = k.id"
        )
        self.write = (
            f"SELECT outcome, figure FROM {s}.write_thread("
            "%s, %s, %s, %s, %s, %s::bytea[], %s::bytea[], %s, %s, %s, %s, %s, %s)"
        )
        self.acquire = (
            f"SELECT granted, owner, token, expires_at FROM {s}.acquire_lease(%s, %s, %s)"
        )
        self.renew = (
            f"UPDATE {s}.leases SET expires_at = extract(epoch FROM clock_timestamp()) + %s "
            "WHERE thread_id = %s AND token = %s RETURNING expires_at"
        )
        self.lease_token = f"SELECT token FROM {s}.leases WHERE thread_id = %s"
        self.lease_token_share = f"{self.lease_token} FOR SHARE"
        self.release = f"DELETE FROM {s}.leases WHERE thread_id = %s AND token = %s RETURNING 1"
        self.list = (
            f"SELECT thread_id FROM {s}.threads WHERE starts_with(thread_id, %s) "
            "ORDER BY thread_id LIMIT %s"
        )
        self.archived = (
            f"SELECT version, start_pos, end_pos, messages, archived_at FROM {s}.archive "
            "WHERE thread_id = %s AND (%s::float8 IS NULL OR archived_at >= %s) ORDER BY id"
        )
        self.delete_thread = f"SELECT {s}.delete_thread(%s)"
