"""The SQLite store's rows: notes, and durable threads (messages at sparse positions, the
archive of compacted originals, the version log, leases). Each function runs in the
store's worker thread, inside one transaction of its own."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from typing import Any, Final

from .._gc import gc_paused
from ..documents import SplitDocuments, join_document, split_document
from ..frozen import frozen_mapping
from ..lifecycle import THREAD_METADATA, expires_at, thread_of_namespace
from ..store_errors import StoreSchemaError
from ..store_protocols import Note
from ..threads import (
    ArchivedRange,
    FencedOut,
    Lease,
    LeaseHeld,
    StaleThreadVersion,
    ThreadRecord,
    ThreadWrite,
    Unchanged,
    check_write_range,
)
from ._sqlite_schema import Immediate, Read, check_integers

__all__ = [
    "GAP",
    "note_from_row",
    "append_notes_row",
    "load_thread",
    "stored_state",
    "purge_archive",
    "write_thread",
    "acquire_lease",
    "renew_lease",
    "release_lease",
    "list_threads",
    "archived",
    "delete_thread",
    "gone",
    "expire_thread",
    "erase_thread",
    "sweep_expired",
    "set_thread_ttl",
]


def note_from_row(namespace: str, row: tuple[Any, ...]) -> Note:
    seq, text, created_at, metadata = row
    return Note(namespace, int(seq), str(text), float(created_at), json.loads(metadata))


def append_notes_row(
    conn: sqlite3.Connection,
    namespace: str,
    texts: tuple[str, ...],
    metadata: str,
    fence: Lease | None = None,
) -> list[Note]:
    with Immediate(conn):
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


GAP = 1 << 20
"""Distance between the positions of appended messages: room for inserting replacements."""


_THREAD_ROW = (
    "SELECT version, length, last_pos, checkpoint, state, lease_owner, lease_token, "
    "lease_expires, updated_at, ttl, state_version FROM tinyctx_threads WHERE thread_id = ?"
)


def stored_state(
    conn: sqlite3.Connection, thread_id: str, own: str | None, state_version: Any
) -> str | None:
    """Inside a transaction: the thread's layer state, from the thread row (``own``, rows
    written before schema 7) or from the version log's row that set it (each state is
    stored once: a write that changes only the messages leaves it where it is)."""
    if state_version is None:
        return own
    check_integers(thread_id, (state_version,), ((0, "state_version", False),))
    row = conn.execute(
        "SELECT state FROM tinyctx_versions WHERE thread_id = ? AND version = ?",
        (thread_id, state_version),
    ).fetchone()
    if row is None or row[0] is None:
        raise StoreSchemaError(
            f"thread {thread_id!r}: its layer state is kept in the version log at version "
            f"{state_version}, and that row has none; the file was changed outside tinyctx "
            "(restore it from a backup, or delete_thread() it)"
        )
    return str(row[0])


def _due(version: Any, updated_at: Any, own: Any, default: float | None) -> bool:
    """Whether a thread row (its version, last write, own TTL) has expired by now."""
    if not isinstance(version, int) or version == 0:
        return False
    own_ttl = None if own is None else float(own)
    return expires_at(float(updated_at), own_ttl, default) <= time.time()


def gone(conn: sqlite3.Connection, thread_id: str, default: float | None) -> bool:
    """Inside a transaction: whether the thread expired (then it reads as absent)."""
    row = conn.execute(
        "SELECT version, updated_at, ttl FROM tinyctx_threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return row is not None and _due(row[0], row[1], row[2], default)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def expire_thread(conn: sqlite3.Connection, thread_id: str) -> bool:
    """Inside a write transaction: remove the thread whole, with its labels and the notes
    of its namespaces (:func:`tinyctx.lifecycle.thread_of_namespace`); whether anything
    of it was there (expiry, and :func:`erase_thread`)."""
    found = _delete_rows(conn, thread_id)
    found += conn.execute(
        "DELETE FROM tinyctx_kv WHERE namespace = ? AND key = ?", (THREAD_METADATA, thread_id)
    ).rowcount
    candidates = conn.execute(
        "SELECT DISTINCT namespace FROM tinyctx_notes WHERE namespace LIKE ? ESCAPE '\\'",
        ("%:thread:" + _escape_like(thread_id),),
    ).fetchall()
    for (namespace,) in candidates:
        if thread_of_namespace(str(namespace)) == thread_id:
            found += conn.execute(
                "DELETE FROM tinyctx_notes WHERE namespace = ?", (namespace,)
            ).rowcount
    return found > 0


def erase_thread(conn: sqlite3.Connection, thread_id: str) -> bool:
    with Immediate(conn):
        return expire_thread(conn, thread_id)


def sweep_expired(conn: sqlite3.Connection, default: float | None) -> list[str]:
    with Immediate(conn):
        rows = conn.execute(
            "SELECT thread_id FROM tinyctx_threads WHERE version > 0 "
            "AND updated_at + COALESCE(ttl, ?) <= ? ORDER BY thread_id",
            (default, time.time()),
        ).fetchall()
        for (thread_id,) in rows:
            expire_thread(conn, str(thread_id))
    return [str(thread_id) for (thread_id,) in rows]


def set_thread_ttl(
    conn: sqlite3.Connection, thread_id: str, seconds: float | None, default: float | None
) -> bool:
    with Immediate(conn):
        if gone(conn, thread_id, default):
            expire_thread(conn, thread_id)
            return False
        cursor = conn.execute(
            "UPDATE tinyctx_threads SET ttl = ?, updated_at = ? "
            "WHERE thread_id = ? AND version > 0",
            (seconds, time.time(), thread_id),
        )
        return cursor.rowcount > 0


_ROW_INTEGERS: Final = ((0, "version", False), (1, "length", False), (6, "lease_token", True))


def _lease_of(thread_id: str, row: tuple[Any, ...] | None) -> Lease | None:
    if row is None:
        return None
    check_integers(thread_id, row, _ROW_INTEGERS)
    if row[6] is None:
        return None
    return Lease(thread_id, str(row[5]), int(row[6]), float(row[7]))


def load_thread(conn: sqlite3.Connection, thread_id: str, ttl: float | None = None) -> ThreadRecord:
    with Read(conn):
        row = conn.execute(_THREAD_ROW, (thread_id,)).fetchone()
        if row is None or _due(row[0], row[8], row[9], ttl):
            return ThreadRecord(thread_id, 0, ())
        check_integers(thread_id, row, _ROW_INTEGERS)
        with gc_paused(row[1]):  # a row tuple per message: see tinyctx._gc
            rows = conn.execute(
                "SELECT doc, content FROM tinyctx_messages WHERE thread_id = ? ORDER BY pos",
                (thread_id,),
            ).fetchall()
        state = stored_state(conn, thread_id, row[4], row[10])
    return ThreadRecord(
        thread_id, row[0], SplitDocuments(rows), row[3], state, _lease_of(thread_id, row)
    )


def purge_archive(conn: sqlite3.Connection, retention: float | None, now: float) -> None:
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
        low, high = 0, GAP * (count + 1)
    elif low is None:
        assert high is not None
        low = high - GAP * (count + 1)
    elif high is None:
        high = low + GAP * (count + 1)
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
        shift = GAP * (len(replacement) + 1)
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


def _log_version(
    conn: sqlite3.Connection,
    thread_id: str,
    version: int,
    now: float,
    change: ThreadWrite,
    replaced: int,
) -> None:
    """The version log's row for one write: what it appended and which range it replaced."""
    compaction = change.compaction
    conn.execute(
        "INSERT INTO tinyctx_versions (thread_id, version, written_at, appended, start, "
        "stop, replaced, run_id, checkpoint_set, checkpoint, state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            thread_id,
            version,
            now,
            len(change.append),
            None if compaction is None else compaction.start,
            None if compaction is None else compaction.end,
            replaced,
            change.run_id,
            0 if isinstance(change.checkpoint, Unchanged) else 1,
            change.checkpoint if isinstance(change.checkpoint, str) else None,
            change.state if isinstance(change.state, str) else None,
        ),
    )


def _update_row(
    conn: sqlite3.Connection,
    thread_id: str,
    change: ThreadWrite,
    counters: tuple[int, int, int, float],
) -> None:
    """The thread row after a write: ``counters`` (version, length, last position, time),
    and the checkpoint and layer state unless the write left them unchanged."""
    sets = "version = ?, length = ?, last_pos = ?, updated_at = ?"
    values: list[Any] = list(counters)
    if not isinstance(change.checkpoint, Unchanged):
        sets += ", checkpoint = ?"
        values.append(change.checkpoint)
    if not isinstance(change.state, Unchanged):
        # stored once: in the version log's row of this write (_log_version)
        sets += ", state = NULL, state_version = ?"
        values.append(counters[0])
    values.append(thread_id)
    conn.execute(f"UPDATE tinyctx_threads SET {sets} WHERE thread_id = ?", values)


def write_thread(
    conn: sqlite3.Connection,
    thread_id: str,
    change: ThreadWrite,
    expected_version: int,
    lease: Lease | None,
    retention: float | None,
    ttl: float | None = None,
) -> int:
    # texts apart from their documents before the write lock is taken
    append = [split_document(doc) for doc in change.append]
    compaction = change.compaction
    replacement = (
        [split_document(doc) for doc in compaction.replacement] if compaction is not None else []
    )
    with Immediate(conn):
        row = conn.execute(
            "SELECT version, length, last_pos, lease_token, updated_at, ttl "
            "FROM tinyctx_threads WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        if row is not None and _due(row[0], row[4], row[5], ttl):
            expire_thread(conn, thread_id)  # expired: the write finds no thread
            row = None
        if row is not None:
            check_integers(
                thread_id,
                row,
                ((0, "version", False), (1, "length", False), (2, "last_pos", False)),
            )
            check_integers(thread_id, row, ((3, "lease_token", True),))
        version, length, last_pos, token = row[:4] if row is not None else (0, 0, 0, None)
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
            purge_archive(conn, retention, now)
        if append:
            conn.executemany(
                "INSERT INTO tinyctx_messages (thread_id, pos, doc, content) VALUES (?, ?, ?, ?)",
                [(thread_id, last_pos + GAP * i, d, c) for i, (d, c) in enumerate(append, 1)],
            )
            last_pos += GAP * len(append)
            length += len(append)
        _log_version(conn, thread_id, new_version, now, change, len(replacement))
        _update_row(conn, thread_id, change, (new_version, length, last_pos, now))
    return new_version


def _next_token(conn: sqlite3.Connection) -> int:
    (token,) = conn.execute(
        "INSERT INTO tinyctx_counters (name, value) VALUES ('lease_token', 1) "
        "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value"
    ).fetchone()
    return int(token)


def acquire_lease(
    conn: sqlite3.Connection, thread_id: str, owner: str, ttl: float, expiry: float | None = None
) -> Lease:
    with Immediate(conn):
        row = conn.execute(_THREAD_ROW, (thread_id,)).fetchone()
        if row is not None and _due(row[0], row[8], row[9], expiry):
            expire_thread(conn, thread_id)  # an expired thread is leased as a new one
            row = None
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


def renew_lease(
    conn: sqlite3.Connection, lease: Lease, ttl: float, expiry: float | None = None
) -> Lease:
    with Immediate(conn):
        if gone(conn, lease.thread_id, expiry):
            expire_thread(conn, lease.thread_id)  # its lease went with it
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


def release_lease(conn: sqlite3.Connection, lease: Lease) -> None:
    with Immediate(conn):
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


def list_threads(
    conn: sqlite3.Connection, prefix: str, limit: int | None, ttl: float | None = None
) -> list[str]:
    # NULL (no TTL) is not expired; an expired thread is listed no more
    query = (
        "SELECT thread_id FROM tinyctx_threads WHERE version > 0 "
        "AND COALESCE(updated_at + COALESCE(ttl, ?) > ?, 1) AND thread_id >= ?"
    )
    args: list[Any] = [ttl, time.time(), prefix]
    end = _prefix_end(prefix)
    if end is not None:
        query += " AND thread_id < ?"
        args.append(end)
    query += " ORDER BY thread_id"
    if limit is not None:
        query += " LIMIT ?"
        args.append(limit)
    return [str(t) for (t,) in conn.execute(query, args).fetchall()]


def archived(
    conn: sqlite3.Connection, thread_id: str, retention: float | None, ttl: float | None = None
) -> list[ArchivedRange]:
    now = time.time()
    cutoff = -math.inf if retention is None else now - retention
    with Read(conn):
        if gone(conn, thread_id, ttl):
            return []
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


def _delete_rows(conn: sqlite3.Connection, thread_id: str) -> int:
    found: int = conn.execute(
        "DELETE FROM tinyctx_threads WHERE thread_id = ?", (thread_id,)
    ).rowcount
    for table in (
        "tinyctx_messages",
        "tinyctx_archive",
        "tinyctx_archive_messages",
        "tinyctx_versions",
    ):
        found += conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,)).rowcount
    return found


def delete_thread(conn: sqlite3.Connection, thread_id: str) -> bool:
    with Immediate(conn):
        return _delete_rows(conn, thread_id) > 0
