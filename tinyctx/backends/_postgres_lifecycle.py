"""The thread-lifecycle capabilities of :class:`~tinyctx.backends.postgres.PostgresStore`.

A mixin of the store (kept apart from its connection and write paths): each method is new
SQL over the store's own tables, run through the store's ``_fetchone``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..lifecycle import ThreadWindow, check_window_args

__all__ = ["PostgresLifecycle"]


def _text(raw: bytes | memoryview | None) -> str | None:
    return None if raw is None else bytes(raw).decode()


class PostgresLifecycle:
    """:class:`~tinyctx.lifecycle.ThreadWindowStore` on PostgreSQL."""

    if TYPE_CHECKING:  # PostgresStore's
        _schema_sql: str

        async def _fetchone(
            self, query: str, params: Sequence[Any], *, once: bool = False
        ) -> tuple[Any, ...] | None: ...

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
            "WHERE t.thread_id = %s"
        )
        row = await self._fetchone(query, (stop, count, stop, thread_id))
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
