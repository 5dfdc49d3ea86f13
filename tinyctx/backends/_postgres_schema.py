"""The PostgreSQL store's schema: its name rule, its migrations (each one transaction,
run under an advisory lock) and every statement the store sends, formatted once per
schema."""

from __future__ import annotations

import re
import zlib

from ..errors import ConfigError
from ._postgres_expiry import ERASE_MIGRATION, EXPIRY_MIGRATION, LIVE, expired_sql
from ._postgres_lifecycle import versions_migration

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "Statements", "check_schema", "lock_key"]

SCHEMA_VERSION = 6
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


# MIGRATIONS[n] takes a schema from version n to n + 1, in one transaction; `{s}` is the
# schema's name
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
MIGRATIONS += (versions_migration(MIGRATIONS[0][9], MIGRATIONS[1][0]),)
# 5: a thread's own TTL, and expiry on the way to every write and lease
# (tinyctx.backends._postgres_expiry)
MIGRATIONS += (EXPIRY_MIGRATION,)
# 6: erase_thread (a thread, its labels and its thread notes), which expiry now goes
# through (tinyctx.retention.delete_threads_where)
MIGRATIONS += (ERASE_MIGRATION,)
assert len(MIGRATIONS) == SCHEMA_VERSION


def lock_key(schema: str) -> int:
    """A stable advisory-lock key for migrating ``schema`` (a signed 64-bit integer)."""
    return zlib.crc32(f"tinyctx-migrate:{schema}".encode()) - 2**31


class Statements:
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
            f"ARRAY(SELECT m.doc FROM {s}.messages m WHERE m.thread_id = k.id ORDER BY m.pos), "
            f"{expired_sql('t')} "
            f"FROM (SELECT %s::text AS id) k "
            f"LEFT JOIN {s}.threads t ON t.thread_id = k.id "
            f"LEFT JOIN {s}.leases l ON l.thread_id = k.id"
        )
        # through expire_thread first: an expired thread is written as a new one
        self.write = (
            f"SELECT outcome, figure FROM {LIVE.format(s=s)}"
            "%s, %s, %s, %s, %s, %s::bytea[], %s::bytea[], %s, %s, %s, %s, %s, %s)"
        )
        self.acquire = (
            f"SELECT granted, owner, token, expires_at FROM {s}.acquire_live("
            "%s, %s, %s, %s::float8, %s::float8)"
        )
        self.renew = (
            f"UPDATE {s}.leases SET expires_at = extract(epoch FROM clock_timestamp()) + %s "
            "WHERE thread_id = %s AND token = %s RETURNING expires_at"
        )
        self.lease_token = f"SELECT token FROM {s}.leases WHERE thread_id = %s"
        self.lease_token_share = f"{self.lease_token} FOR SHARE"
        self.release = f"DELETE FROM {s}.leases WHERE thread_id = %s AND token = %s RETURNING 1"
        self.list = (
            f"SELECT thread_id FROM {s}.threads t WHERE starts_with(thread_id, %s) "
            f"AND NOT {expired_sql('t')} ORDER BY thread_id LIMIT %s"
        )
        self.archived = (
            f"SELECT version, start_pos, end_pos, messages, archived_at FROM {s}.archive "
            "WHERE thread_id = %s AND (%s::float8 IS NULL OR archived_at >= %s) "
            f"AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.thread_id = %s "
            f"AND {expired_sql('t')}) ORDER BY id"
        )
        self.delete_thread = f"SELECT {s}.delete_thread(%s)"
