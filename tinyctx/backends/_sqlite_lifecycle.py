"""The thread-lifecycle capabilities of :class:`~tinyctx.backends.sqlite.SqliteStore`
(windows, versions, archive pruning): the optional protocols of :mod:`tinyctx.history`."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..documents import join_document
from ..lifecycle import ThreadWindow, check_age, check_window_args
from ..threads import check_thread_id
from ..versions import ThreadVersion
from ._sqlite_schema import Immediate, Read, check_integers
from ._sqlite_threads import gone, stored_state

__all__ = ["SqliteLifecycle"]

T = TypeVar("T")


def _load_window(
    conn: sqlite3.Connection, thread_id: str, stop: int | None, count: int, ttl: float | None
) -> ThreadWindow:
    with Read(conn):
        if gone(conn, thread_id, ttl):
            return ThreadWindow(thread_id, 0, 0, 0, ())
        row = conn.execute(
            "SELECT version, length, checkpoint, state, state_version FROM tinyctx_threads "
            "WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        if row is None:
            return ThreadWindow(thread_id, 0, 0, 0, ())
        check_integers(thread_id, row, ((0, "version", False), (1, "length", False)))
        version, length, checkpoint, own_state, state_version = row
        state = stored_state(conn, thread_id, own_state, state_version)
        end = length if stop is None else min(stop, length)
        start = max(0, end - count)
        rows: list[tuple[Any, ...]] = []
        if end > start:
            # newest first from the end of the log: the newest page skips nothing
            rows = conn.execute(
                "SELECT doc, content FROM tinyctx_messages WHERE thread_id = ? "
                "ORDER BY pos DESC LIMIT ? OFFSET ?",
                (thread_id, end - start, length - end),
            ).fetchall()
    rows.reverse()
    docs = tuple(join_document(doc, content) for doc, content in rows)
    return ThreadWindow(thread_id, version, length, start, docs, checkpoint, state)


class SqliteLifecycle:
    """:class:`~tinyctx.history.ThreadWindowStore` over a SqliteStore's tables."""

    if TYPE_CHECKING:  # SqliteStore's
        ttl: float | None

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` live messages before ``stop``, in one read transaction;
        see :meth:`tinyctx.history.ThreadWindowStore.load_window`."""
        check_window_args(thread_id, stop, count)
        return await self._run(lambda conn: _load_window(conn, thread_id, stop, count, self.ttl))

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """What each write did, oldest first; see :mod:`tinyctx.versions`."""
        check_thread_id(thread_id)

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            with Read(conn):
                if gone(conn, thread_id, self.ttl):
                    return []
                rows: list[tuple[Any, ...]] = conn.execute(
                    "SELECT version, written_at, appended, start, stop, replaced, run_id "
                    "FROM tinyctx_versions WHERE thread_id = ? ORDER BY version",
                    (thread_id,),
                ).fetchall()
            return rows

        rows = await self._run(read)
        return [ThreadVersion(*row) for row in rows]

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        """The checkpoint and state the thread had at ``version``, in one read
        transaction; see :class:`tinyctx.versions.ThreadLayersStore`."""
        check_thread_id(thread_id)

        def read(conn: sqlite3.Connection) -> tuple[str | None, str | None]:
            with Read(conn):
                if gone(conn, thread_id, self.ttl):
                    return None, None
                newest = (
                    "FROM tinyctx_versions WHERE thread_id = ? AND version <= ? AND {} "
                    "ORDER BY version DESC LIMIT 1"
                )
                checkpoint = conn.execute(
                    "SELECT checkpoint " + newest.format("checkpoint_set = 1"),
                    (thread_id, version),
                ).fetchone()
                state = conn.execute(
                    "SELECT state " + newest.format("state IS NOT NULL"), (thread_id, version)
                ).fetchone()
            return (
                None if checkpoint is None else checkpoint[0],
                None if state is None else state[0],
            )

        return await self._run(read)

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Drop archived ranges older than ``older_than`` seconds, in one transaction."""
        check_thread_id(thread_id)
        cutoff = time.time() - check_age(older_than)

        def prune(conn: sqlite3.Connection) -> int:
            with Immediate(conn):
                conn.execute(
                    "DELETE FROM tinyctx_archive_messages WHERE thread_id = ? AND version IN "
                    "(SELECT version FROM tinyctx_archive WHERE thread_id = ? "
                    "AND archived_at < ?)",
                    (thread_id, thread_id, cutoff),
                )
                removed: int = conn.execute(
                    "DELETE FROM tinyctx_archive WHERE thread_id = ? AND archived_at < ?",
                    (thread_id, cutoff),
                ).rowcount
            return removed

        return await self._run(prune)
