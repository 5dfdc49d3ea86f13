"""Thread expiry on PostgreSQL (:class:`~tinyctx.lifecycle.ThreadExpiryStore`): a sweep.

Schema 5 gives each thread row its own ``ttl`` (NULL: the store's ``ttl=``), counted from
``updated_at`` (its last write, by the writer's clock). ``expire_thread`` removes an
expired thread whole under its row lock: rows of every table, its labels and the notes of
its namespaces. The write and the lease grant go through it first (``write_live``,
``acquire_live``), so an expired thread is never written to or leased as it was; reads
treat an expired row as absent until ``sweep_expired`` removes it.

Schema 6 splits the removal out as ``erase_thread`` (``delete_thread``'s locked delete,
then the labels and the thread notes), which ``expire_thread`` calls once the row is
locked and found expired, and :meth:`PostgresExpiry.erase_thread` calls on any thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..lifecycle import THREAD_METADATA
from ..threads import check_thread_id

__all__ = ["EXPIRY_MIGRATION", "ERASE_MIGRATION", "PostgresExpiry", "LIVE", "expired_sql"]

_WRITE_PARAMS: Final = (
    "p_thread text, p_expected bigint, p_token bigint, p_start integer, p_end integer, "
    "p_replacement bytea[], p_append bytea[], p_set_checkpoint boolean, p_checkpoint bytea, "
    "p_set_state boolean, p_state bytea, p_now float8, p_keep_after float8"
)
_WRITE_ARGS: Final = (
    "p_thread, p_expected, p_token, p_start, p_end, p_replacement, p_append, "
    "p_set_checkpoint, p_checkpoint, p_set_state, p_state, p_now, p_keep_after"
)

# the first ':thread:' of the namespace starts its suffix ':thread:<id>'
# (tinyctx.lifecycle.thread_of_namespace)
_OWN_NOTES: Final = (
    "right(q.namespace, length(v_suffix)) = v_suffix "
    "AND strpos(q.namespace, ':thread:') = length(q.namespace) - length(v_suffix) + 1"
)
# a thread's labels and the notes of its namespaces (v_suffix: ':thread:' || p_thread)
_DROP_LABELS: Final = (
    f"    DELETE FROM {{s}}.kv k WHERE k.namespace = '{THREAD_METADATA}' AND k.key = p_thread;"
)
_DROP_NOTES: Final = (
    "    DELETE FROM {s}.notes n WHERE n.namespace IN (\n"
    f"        SELECT q.namespace FROM {{s}}.note_seq q WHERE {_OWN_NOTES});"
)

EXPIRY_MIGRATION: Final = (
    "ALTER TABLE {s}.threads ADD COLUMN IF NOT EXISTS ttl float8",
    # the run that made each version, and the checkpoint and layer state it set
    # (tinyctx.versions; NULL before, outside a run, or unchanged)
    "ALTER TABLE {s}.versions ADD COLUMN IF NOT EXISTS run_id text, "
    "ADD COLUMN IF NOT EXISTS checkpoint_set boolean, "
    "ADD COLUMN IF NOT EXISTS checkpoint bytea, ADD COLUMN IF NOT EXISTS state bytea",
    f"""
CREATE OR REPLACE FUNCTION {{s}}.expire_thread(p_thread text, p_default float8, p_now float8)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_suffix text := ':thread:' || p_thread;
BEGIN
    PERFORM 1 FROM {{s}}.threads t WHERE t.thread_id = p_thread AND t.version > 0
        AND t.updated_at + coalesce(t.ttl, p_default) <= p_now FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM {{s}}.messages m WHERE m.thread_id = p_thread;
    DELETE FROM {{s}}.archive a WHERE a.thread_id = p_thread;
    DELETE FROM {{s}}.versions v WHERE v.thread_id = p_thread;
    DELETE FROM {{s}}.leases l WHERE l.thread_id = p_thread;
    DELETE FROM {{s}}.threads t WHERE t.thread_id = p_thread;
{_DROP_LABELS}
{_DROP_NOTES}
    DELETE FROM {{s}}.note_seq q WHERE {_OWN_NOTES};
    RETURN true;
END
$$""",
    f"""
CREATE OR REPLACE FUNCTION {{s}}.write_live(p_default float8, p_run_id text, {_WRITE_PARAMS})
RETURNS TABLE (outcome text, figure bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
    v_figure bigint;
BEGIN
    PERFORM {{s}}.expire_thread(p_thread, p_default, p_now);
    SELECT w.outcome, w.figure INTO v_outcome, v_figure FROM {{s}}.write_thread({_WRITE_ARGS}) w;
    IF v_outcome = 'ok' AND (p_run_id IS NOT NULL OR p_set_checkpoint OR p_set_state) THEN
        UPDATE {{s}}.versions v SET run_id = p_run_id, checkpoint_set = p_set_checkpoint,
            checkpoint = CASE WHEN p_set_checkpoint THEN p_checkpoint END,
            state = CASE WHEN p_set_state THEN p_state END
            WHERE v.thread_id = p_thread AND v.version = v_figure;
    END IF;
    RETURN QUERY SELECT v_outcome, v_figure;
END
$$""",
    """
CREATE OR REPLACE FUNCTION {s}.acquire_live(
    p_thread text, p_owner text, p_ttl float8, p_default float8, p_now float8
) RETURNS TABLE (granted boolean, owner text, token bigint, expires_at float8)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.expire_thread(p_thread, p_default, p_now);
    RETURN QUERY SELECT a.granted, a.owner, a.token, a.expires_at
        FROM {s}.acquire_lease(p_thread, p_owner, p_ttl) a;
END
$$""",
    """
CREATE OR REPLACE FUNCTION {s}.set_ttl(p_thread text, p_ttl float8, p_default float8, p_now float8)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.expire_thread(p_thread, p_default, p_now);
    UPDATE {s}.threads t SET ttl = p_ttl, updated_at = p_now
        WHERE t.thread_id = p_thread AND t.version > 0;
    RETURN FOUND;
END
$$""",
    """
CREATE OR REPLACE FUNCTION {s}.sweep_expired(p_default float8, p_now float8) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_thread text;
BEGIN
    FOR v_thread IN SELECT t.thread_id FROM {s}.threads t WHERE t.version > 0
        AND t.updated_at + coalesce(t.ttl, p_default) <= p_now ORDER BY t.thread_id
    LOOP
        IF {s}.expire_thread(v_thread, p_default, p_now) THEN
            RETURN NEXT v_thread;
        END IF;
    END LOOP;
END
$$""",
)

ERASE_MIGRATION: Final = (
    f"""
CREATE OR REPLACE FUNCTION {{s}}.erase_thread(p_thread text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_suffix text := ':thread:' || p_thread;
    v_found boolean;
BEGIN
    -- under the thread's row lock (delete_thread's), as a write of it
    v_found := {{s}}.delete_thread(p_thread);
{_DROP_LABELS}
    v_found := v_found OR FOUND;
{_DROP_NOTES}
    v_found := v_found OR FOUND;
    DELETE FROM {{s}}.note_seq q WHERE {_OWN_NOTES};
    RETURN v_found OR FOUND;
END
$$""",
    """
CREATE OR REPLACE FUNCTION {s}.expire_thread(p_thread text, p_default float8, p_now float8)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {s}.threads t WHERE t.thread_id = p_thread AND t.version > 0
        AND t.updated_at + coalesce(t.ttl, p_default) <= p_now FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {s}.erase_thread(p_thread);
    RETURN true;
END
$$""",
)

LIVE: Final = "{s}.write_live(%s::float8, %s::text, "
"""What the write statement calls instead of ``write_thread(`` (the same arguments after
the store's TTL and the write's run id)."""


def expired_sql(alias: str) -> str:
    """A condition true for an expired thread row ``alias`` (two parameters: the store's
    TTL, now); NULL (no TTL) is false."""
    return (
        f"coalesce({alias}.version > 0 AND "
        f"{alias}.updated_at + coalesce({alias}.ttl, %s::float8) <= %s::float8, false)"
    )


class PostgresExpiry:
    """Thread TTLs and the sweep on PostgreSQL (see the module docstring)."""

    if TYPE_CHECKING:  # PostgresStore's
        _schema_sql: str
        ttl: float | None

        async def _fetchall(
            self, query: str, params: Sequence[Any], *, once: bool = False, first: bool = False
        ) -> list[tuple[Any, ...]]: ...

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        """The thread's own TTL from now (None: the store's; ``math.inf``: never)."""
        rows = await self._fetchall(
            f"SELECT {self._schema_sql}.set_ttl(%s, %s::float8, %s::float8, %s::float8)",
            (check_thread_id(thread_id), seconds, self.ttl, time.time()),
        )
        return bool(rows and rows[0][0])

    async def erase_thread(self, thread_id: str) -> bool:
        """The thread, its labels and its thread notes, in one transaction under the
        thread's row lock; see :class:`tinyctx.lifecycle.ThreadEraseStore`."""
        rows = await self._fetchall(
            f"SELECT {self._schema_sql}.erase_thread(%s)", (check_thread_id(thread_id),), once=True
        )
        return bool(rows and rows[0][0])

    async def sweep_expired(self) -> list[str]:
        """Remove every expired thread whole (each under its row lock); their ids."""
        rows = await self._fetchall(
            f"SELECT * FROM {self._schema_sql}.sweep_expired(%s::float8, %s::float8)",
            (self.ttl, time.time()),
            once=True,
        )
        return sorted(str(row[0]) for row in rows)
