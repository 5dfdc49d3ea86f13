"""The thread-lifecycle capabilities of :class:`~tinyctx.backends.postgres.PostgresStore`.

A mixin of the store (kept apart from its connection and write paths): each method is new
SQL over the store's own tables, run through the store's ``_fetchone``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..lifecycle import ThreadWindow, check_age, check_window_args
from ..threads import check_thread_id
from ..versions import ThreadVersion
from ._postgres_expiry import expired_sql

__all__ = ["PostgresLifecycle", "versions_migration"]


def versions_migration(write_thread: str, delete_thread: str) -> tuple[str, ...]:
    """Schema 4: what each write did (:mod:`tinyctx.versions`), recorded by the write
    function in the write's own transaction; ``delete_thread`` removes the records too.
    Built from the current definitions of both functions (``{s}``-templated), each
    replaced with one statement more."""
    record = (
        "    INSERT INTO {s}.versions (thread_id, version, written_at, appended, start_pos,\n"
        "                              end_pos, replaced)\n"
        "        VALUES (p_thread, v_new, p_now, cardinality(p_append), p_start, p_end,\n"
        "                CASE WHEN p_start IS NULL THEN 0 ELSE cardinality(p_replacement) END);\n"
    )
    ok = "    RETURN QUERY SELECT 'ok'::text, v_new;"
    assert write_thread.count(ok) == 1
    writes = write_thread.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
        ok, record + ok
    )
    gone = "    DELETE FROM {s}.archive a WHERE a.thread_id = p_thread;"
    assert delete_thread.count(gone) == 1
    deletes = delete_thread.replace(
        gone, gone + "\n    DELETE FROM {s}.versions v WHERE v.thread_id = p_thread;"
    )
    return (
        'CREATE TABLE IF NOT EXISTS {s}.versions (thread_id text COLLATE "C" NOT NULL, '
        "version bigint NOT NULL, written_at float8 NOT NULL, appended integer NOT NULL, "
        "start_pos integer, end_pos integer, replaced integer NOT NULL, "
        "PRIMARY KEY (thread_id, version))",
        writes,
        deletes,
    )


def _text(raw: bytes | memoryview | None) -> str | None:
    return None if raw is None else bytes(raw).decode()


class PostgresLifecycle:
    """:class:`~tinyctx.lifecycle.ThreadWindowStore` on PostgreSQL."""

    if TYPE_CHECKING:  # PostgresStore's
        _schema_sql: str
        ttl: float | None

        async def _fetchone(
            self, query: str, params: Sequence[Any], *, once: bool = False
        ) -> tuple[Any, ...] | None: ...

        async def _fetchall(
            self, query: str, params: Sequence[Any], *, once: bool = False, first: bool = False
        ) -> list[tuple[Any, ...]]: ...

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """What each write did, oldest first; see :mod:`tinyctx.versions`."""
        s = self._schema_sql
        rows = await self._fetchall(
            "SELECT version, written_at, appended, start_pos, end_pos, replaced, run_id "
            f"FROM {s}.versions WHERE thread_id = %s AND NOT EXISTS (SELECT 1 FROM "
            f"{s}.threads t WHERE t.thread_id = %s AND {expired_sql('t')}) ORDER BY version",
            (check_thread_id(thread_id), thread_id, self.ttl, time.time()),
        )
        return [
            ThreadVersion(
                int(v),
                float(at),
                int(n),
                None if s is None else int(s),
                None if e is None else int(e),
                int(r),
                None if run is None else str(run),
            )
            for v, at, n, s, e, r, run in rows
        ]

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        """The checkpoint and state the thread had at ``version``, in one statement; see
        :class:`tinyctx.versions.ThreadLayersStore`."""
        s = self._schema_sql
        newest = (
            f"FROM {s}.versions v WHERE v.thread_id = k.id AND v.version <= k.at AND {{}} "
            "ORDER BY v.version DESC LIMIT 1"
        )
        row = await self._fetchone(
            f"SELECT (SELECT v.checkpoint {newest.format('v.checkpoint_set')}), "
            f"(SELECT v.state {newest.format('v.state IS NOT NULL')}), "
            f"(SELECT {expired_sql('t')} FROM {s}.threads t WHERE t.thread_id = k.id) "
            "FROM (SELECT %s::text AS id, %s::bigint AS at) k",
            (self.ttl, time.time(), check_thread_id(thread_id), version),
        )
        if row is None or row[2]:
            return None, None
        return _text(row[0]), _text(row[1])

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` live messages before ``stop``, in one statement (one
        snapshot); see :meth:`tinyctx.lifecycle.ThreadWindowStore.load_window`."""
        check_window_args(thread_id, stop, count)
        s = self._schema_sql
        # positions are the live indexes 0..length-1; least() ignores a NULL stop
        query = (
            "SELECT t.version, t.length, t.checkpoint, t.state, w.stop - w.count, "
            f"ARRAY(SELECT m.doc FROM {s}.messages m WHERE m.thread_id = t.thread_id "
            "AND m.pos >= w.stop - w.count AND m.pos < w.stop ORDER BY m.pos) "
            f"FROM {s}.threads t, LATERAL (SELECT least(%s::bigint, t.length) AS stop, "
            "least(%s::bigint, least(%s::bigint, t.length)) AS count) w "
            f"WHERE t.thread_id = %s AND NOT {expired_sql('t')}"
        )
        row = await self._fetchone(query, (stop, count, stop, thread_id, self.ttl, time.time()))
        if row is None:
            return ThreadWindow(thread_id, 0, 0, 0, ())
        version, length, checkpoint, state, start, docs = row
        return ThreadWindow(
            thread_id,
            int(version),
            int(length),
            int(start),
            tuple(bytes(doc).decode() for doc in docs),
            _text(checkpoint),
            _text(state),
        )

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Drop archived ranges older than ``older_than`` seconds, in one statement."""
        cutoff = time.time() - check_age(older_than)
        row = await self._fetchone(
            f"WITH d AS (DELETE FROM {self._schema_sql}.archive WHERE thread_id = %s "
            "AND archived_at < %s RETURNING 1) SELECT count(*) FROM d",
            (check_thread_id(thread_id), cutoff),
            once=True,
        )
        return 0 if row is None else int(row[0])
