"""SqliteStore's durable step: layer state stored once, small writes made on the loop."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from tinyctx import SqliteStore, UserMessage
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.stores import StoreSchemaError
from tinyctx.threads import FencedOut, StaleThreadVersion, ThreadWrite


def _docs(*texts: str) -> tuple[str, ...]:
    return encode_messages([UserMessage(t) for t in texts])


def _raw(path: Path, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as raw, raw:
        return raw.execute(sql, args).fetchall()


def _wal_bytes(path: Path) -> int:
    """The size the file's WAL grew to (SQLite reuses it from the start after a
    checkpoint, so its size is the most it ever held)."""
    return Path(f"{path}-wal").stat().st_size


class TestLayerStateStoredOnce:
    """The layer state is kept once, in the version log's row of the write that set it,
    and every read of the thread finds it there."""

    async def test_the_state_reads_back_after_writes_that_leave_it(self, tmp_path: Path) -> None:
        """load_thread, load_window and layers_as_of read the state a write set, through
        later writes that changed only the messages; the file holds one copy of it."""
        path = tmp_path / "s.db"
        async with SqliteStore(path) as store:
            v = await store.write("t", ThreadWrite(_docs("a"), state="S1"), expected_version=0)
            v = await store.write("t", ThreadWrite(_docs("b")), expected_version=v)
            v = await store.write("t", ThreadWrite(_docs("c"), state="S2"), expected_version=v)
            v = await store.write("t", ThreadWrite(_docs("d")), expected_version=v)
            record = await store.load_thread("t")
            assert (record.version, record.state) == (4, "S2")
            assert [m.text for m in decode_messages(record.messages)] == ["a", "b", "c", "d"]
            assert (await store.load_window("t", count=1)).state == "S2"
            assert (await store.layers_as_of("t", 2))[1] == "S1"
            assert (await store.layers_as_of("t", 4))[1] == "S2"
        copies = _raw(
            path,
            "SELECT (SELECT COUNT(*) FROM tinyctx_versions WHERE state = 'S2'), "
            "(SELECT COUNT(*) FROM tinyctx_threads WHERE state IS NOT NULL)",
        )
        assert copies == [(1, 0)]

    async def test_a_version_6_file_keeps_its_state_through_the_migration(
        self, tmp_path: Path
    ) -> None:
        """A thread written before schema 7 (state in its own row) reads its state after
        the migration, keeps it through a write of messages, and a new state replaces it."""
        path = tmp_path / "v6.db"
        async with SqliteStore(path) as store:
            await store.write("t", ThreadWrite(_docs("a")), expected_version=0)
        with closing(sqlite3.connect(path)) as raw, raw:  # back to version 6
            raw.execute("ALTER TABLE tinyctx_threads DROP COLUMN state_version")
            raw.execute("UPDATE tinyctx_threads SET state = 'OLD'")
            raw.execute("UPDATE tinyctx_schema SET version = 6")
        async with SqliteStore(path) as store:
            assert await store.schema_version() == 7
            assert (await store.load_thread("t")).state == "OLD"
            await store.write("t", ThreadWrite(_docs("b")), expected_version=1)
            assert (await store.load_thread("t")).state == "OLD"
            assert (await store.load_window("t", count=1)).state == "OLD"
            await store.write("t", ThreadWrite(state="NEW"), expected_version=2)
            assert (await store.load_thread("t")).state == "NEW"

    async def test_a_thread_row_pointing_at_a_missing_state_is_named(self, tmp_path: Path) -> None:
        """A version log row removed outside tinyctx is a clear error, never an empty state."""
        path = tmp_path / "s.db"
        async with SqliteStore(path) as store:
            await store.write("t", ThreadWrite(_docs("a"), state="S1"), expected_version=0)
        _raw(path, "DELETE FROM tinyctx_versions")
        async with SqliteStore(path) as store:
            with pytest.raises(StoreSchemaError, match="version log at version 1"):
                await store.load_thread("t")


class TestSmallWritesOnTheLoop:
    """Small writes made on the event loop keep every guarantee of a write on the
    store's thread: a locked file is waited for off the loop, fencing and versions still
    refuse, and the WAL is still folded back into the file."""

    async def test_a_locked_file_is_waited_for_off_the_loop(self, tmp_path: Path) -> None:
        """While another connection holds the write lock, the write waits on the store's
        thread (the loop keeps running other tasks) and lands once the lock is free."""
        path = tmp_path / "s.db"
        async with SqliteStore(path) as store:
            v = await store.write("t", ThreadWrite(_docs("a")), expected_version=0)
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            ticks = 0
            landed: list[int] = []

            async def write() -> None:
                landed.append(await store.write("t", ThreadWrite(_docs("b")), expected_version=v))

            async with anyio.create_task_group() as group:
                group.start_soon(write)
                for _ in range(20):
                    await anyio.sleep(0.01)
                    ticks += 1
                assert landed == []  # still waiting for the lock
                holder.execute("ROLLBACK")
                holder.close()
            assert ticks == 20 and landed == [2]
            record = await store.load_thread("t")
            assert [m.text for m in decode_messages(record.messages)] == ["a", "b"]

    async def test_fencing_and_versions_still_refuse(self, tmp_path: Path) -> None:
        """A stale lease and a stale version are refused and write nothing."""
        path = tmp_path / "s.db"
        async with SqliteStore(path) as first, SqliteStore(path) as second:
            old = await first.acquire_lease("t", "w1", 60)
            v = await first.write("t", ThreadWrite(_docs("a")), expected_version=0, lease=old)
            await first.release_lease(old)
            await second.acquire_lease("t", "w2", 60)
            with pytest.raises(FencedOut):
                await first.write("t", ThreadWrite(_docs("x")), expected_version=v, lease=old)
            with pytest.raises(StaleThreadVersion):
                await first.write("t", ThreadWrite(_docs("y")), expected_version=0)
            record = await second.load_thread("t")
            assert record.version == 1
            assert [m.text for m in decode_messages(record.messages)] == ["a"]

    async def test_the_wal_is_still_checkpointed(self, tmp_path: Path) -> None:
        """Many small writes leave the WAL near SQLite's 1000-page checkpoint size, not
        growing with every write (the store's thread folds it back)."""
        path = tmp_path / "s.db"
        state = "S" * 9000
        async with SqliteStore(path) as store:
            v = 0
            for index in range(1280):
                change = ThreadWrite(_docs(f"m{index}"), state=f"{state}{index}")
                v = await store.write("t", change, expected_version=v)
            assert v == 1280
            wal = _wal_bytes(path)
        # unchecked, the 1280 writes' frames would need about 60 MB
        assert wal < 16 << 20
