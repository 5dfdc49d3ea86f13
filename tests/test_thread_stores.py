"""The ThreadStore and Store conformance suites over MemoryStore (and SQLite: see below)."""

from __future__ import annotations

import gc
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

import tinyctx.backends._sqlite_threads as sqlite_rows
from tinyctx import ConfigError, MemoryStore, SqliteStore, UserMessage
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.documents import join_document
from tinyctx.testing.store_conformance import StoreFactory, ThreadStoreConformance
from tinyctx.threads import Compaction, ThreadWrite


async def _memory(
    *, archive_retention: float | None = None, ttl: float | None = None
) -> MemoryStore:
    return MemoryStore(archive_retention=archive_retention, ttl=ttl)


class TestMemoryThreadStore(ThreadStoreConformance):
    """MemoryStore keeps the whole ThreadStore contract."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return _memory

    async def stored_traces(self, store: Any, thread_id: str) -> list[str]:
        """What the store's dictionaries hold that names ``thread_id``."""
        traces = [f"thread {thread_id}"] if thread_id in store._threads else []
        traces += [
            f"kv {namespace}/{key}"
            for namespace, values in store._data.items()
            for key in values
            if thread_id in namespace or thread_id in key
        ]
        return traces + [
            f"notes {namespace}" for namespace in store._notes if thread_id in namespace
        ]


class TestConfiguration:
    """Bad store settings are refused at construction, naming the setting."""

    @pytest.mark.parametrize("retention", [-1, "1h", True, float("nan")])
    def test_bad_retention_is_a_config_error(self, retention: object) -> None:
        """archive_retention is None or seconds >= 0."""
        with pytest.raises(ConfigError, match="archive_retention"):
            MemoryStore(archive_retention=retention)  # type: ignore[arg-type]


class TestSqliteThreadStore(ThreadStoreConformance):
    """SqliteStore keeps the whole ThreadStore contract, across two connections too."""

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> SqliteStore:
            return SqliteStore(
                tmp_path / "threads.db", archive_retention=archive_retention, ttl=ttl
            )

        return make

    async def open_peer(self, store: Any) -> Any:
        return SqliteStore(store.path)

    async def stored_traces(self, store: Any, thread_id: str) -> list[str]:
        """Every row of every table of the file that names ``thread_id``."""
        with closing(sqlite3.connect(store.path)) as conn:
            tables = [
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return [
                f"{table}: {row!r:.80}"
                for table in tables
                for row in conn.execute(f"SELECT * FROM {table}")
                if thread_id in repr(row)
            ]


class TestSqliteThreadStoreWithoutRoom(TestSqliteThreadStore):
    """The same contract when positions leave no room between messages: every insertion
    takes the path that moves the tail (normally after ~20 inserts at one spot)."""

    @pytest.fixture
    def make_store(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StoreFactory:
        monkeypatch.setattr(sqlite_rows, "GAP", 2)

        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> SqliteStore:
            return SqliteStore(tmp_path / "tight.db", archive_retention=archive_retention, ttl=ttl)

        return make


_WRITER = """
import sys, anyio
from tinyctx import SqliteStore, UserMessage
from tinyctx.codec import encode_messages
from tinyctx.threads import StaleThreadVersion, ThreadWrite

async def main(path, name, count):
    store = SqliteStore(path, timeout=60)
    done = 0
    while done < count:
        record = await store.load_thread("shared")
        doc = encode_messages([UserMessage(f"{name}:{done}")])
        try:
            await store.write("shared", ThreadWrite(doc), expected_version=record.version)
        except StaleThreadVersion:
            continue
        done += 1
    await store.aclose()

anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""

_LOOPER = """
import sys, anyio
from tinyctx import SqliteStore, UserMessage
from tinyctx.codec import encode_messages
from tinyctx.threads import Compaction, ThreadWrite

async def main(path):
    store = SqliteStore(path)
    version = 0
    while True:
        docs = encode_messages([UserMessage(f"{version}:{i}" * 50) for i in range(3)])
        # every 5th write also compacts its own previous 3 messages into 3 new ones
        compaction = Compaction(3 * version - 3, 3 * version, docs) if version % 5 == 4 else None
        version = await store.write(
            "t", ThreadWrite(docs, compaction, state=str(version + 1)), expected_version=version
        )
        print(version, flush=True)

anyio.run(main, sys.argv[1])
"""


def _rows(path: Path) -> list[tuple[int, str]]:
    """Each stored message's position and document (joined from its head and text)."""
    with closing(sqlite3.connect(path)) as raw, raw:
        rows = raw.execute("SELECT pos, doc, content FROM tinyctx_messages ORDER BY pos").fetchall()
    raw.close()
    return [(int(p), join_document(d, c)) for p, d, c in rows]


class TestSqliteThreads:
    """SQLite specifics: what a write touches, many processes on one file, SIGKILL."""

    async def test_a_long_thread_is_read_with_the_collector_held_off(self, tmp_path: Path) -> None:
        """Reading a long thread's rows (a tuple per message) pauses the cyclic collector
        and restores it; a short thread's read leaves it alone, and a collector the
        application turned off stays off."""
        seen: list[tuple[str, bool]] = []

        def trace(statement: str) -> None:
            if statement.startswith("SELECT doc, content"):
                seen.append((statement, gc.isenabled()))

        async with SqliteStore(tmp_path / "t.db") as store:
            for thread, size in (("long", 100), ("short", 10)):
                docs = encode_messages([UserMessage(f"m{i}") for i in range(size)])
                await store.write(thread, ThreadWrite(docs), expected_version=0)
            await store._run(lambda conn: conn.set_trace_callback(trace))
            assert gc.isenabled()
            assert len((await store.load_thread("long")).messages) == 100
            assert len((await store.load_thread("short")).messages) == 10
            assert [enabled for _, enabled in seen] == [False, True] and gc.isenabled()
            gc.disable()
            try:
                await store.load_thread("long")
                assert not gc.isenabled()
            finally:
                gc.enable()

    async def test_a_compaction_touches_only_the_replaced_range(self, tmp_path: Path) -> None:
        """Rows outside the replaced range keep their position and bytes; an append adds
        only its rows (no rewrite of the log)."""
        path = tmp_path / "t.db"
        docs = encode_messages([UserMessage(f"m{i}") for i in range(50)])
        async with SqliteStore(path) as store:
            await store.write("t", ThreadWrite(docs), expected_version=0)
            before = _rows(path)
            change = ThreadWrite(encode_messages([UserMessage("z")]), Compaction(10, 20, docs[:2]))
            await store.write("t", change, expected_version=1)
            after = _rows(path)
            kept = [row for row in before if row not in before[10:20]]
            assert set(kept) <= set(after)
            assert len(after) == len(before) - 10 + 2 + 1
            assert [d for _, d in after] == [*docs[:10], *docs[:2], *docs[20:], *change.append]
            await store.write("t", ThreadWrite(docs[:1]), expected_version=2)
            assert _rows(path)[:-1] == after

    async def test_many_insertions_at_one_spot_keep_the_order(self, tmp_path: Path) -> None:
        """Prepending, then inserting again and again between two messages (past the room
        between their positions) keeps every message in order, appends included."""
        async with SqliteStore(tmp_path / "t.db") as store:
            model = list(encode_messages([UserMessage("first"), UserMessage("last")]))
            version = await store.write("t", ThreadWrite(tuple(model)), expected_version=0)
            for i in range(5):  # prepends: positions below the first (negative ones too)
                doc = encode_messages([UserMessage(f"prepend {i}")])
                change = ThreadWrite(compaction=Compaction(0, 0, doc))
                version = await store.write("t", change, expected_version=version)
                model[0:0] = doc
            for i in range(45):
                doc = encode_messages([UserMessage(f"insert {i}")])
                change = ThreadWrite(compaction=Compaction(1, 1, doc))
                version = await store.write("t", change, expected_version=version)
                model[1:1] = doc
            tail = encode_messages([UserMessage("appended")])
            await store.write("t", ThreadWrite(tail), expected_version=version)
            assert (await store.load_thread("t")).messages == (*model, *tail)

    @pytest.mark.slow  # several writer processes on one file
    def test_processes_on_one_file_lose_and_duplicate_nothing(self, tmp_path: Path) -> None:
        """Three interpreters racing on one thread (versions and retries): every write lands
        exactly once, each writer's in its own order."""
        path = tmp_path / "shared.db"
        script = tmp_path / "writer.py"
        script.write_text(_WRITER)
        count = 15
        procs = [
            subprocess.Popen([sys.executable, str(script), str(path), f"w{n}", str(count)])
            for n in range(3)
        ]
        for proc in procs:
            assert proc.wait(timeout=120) == 0

        async def check() -> None:
            async with SqliteStore(path) as store:
                record = await store.load_thread("shared")
            texts = [m.text for m in decode_messages(record.messages)]
            assert record.version == len(texts) == 3 * count
            for n in range(3):
                assert [t for t in texts if t.startswith(f"w{n}:")] == [
                    f"w{n}:{i}" for i in range(count)
                ]

        anyio.run(check)

    @pytest.mark.slow  # a crash trial: real processes SIGKILLed
    def test_sigkill_mid_write_leaves_a_whole_thread(self, tmp_path: Path) -> None:
        """A writer killed at random moments (about 5 trials) leaves every thread at its last
        committed version: length, state and messages agree, every document decodes."""
        rng = random.Random(13)
        for trial in range(5):
            path = tmp_path / f"kill-{trial}.db"
            script = tmp_path / "looper.py"
            script.write_text(_LOOPER)
            proc = subprocess.Popen(
                [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            proc.stdout.readline()  # at least one write committed
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()

            async def check() -> None:
                async with SqliteStore(path) as store:
                    record = await store.load_thread("t")
                assert record.version >= 1
                assert len(record.messages) == 3 * record.version
                assert record.state == str(record.version)
                decode_messages(record.messages)

            anyio.run(check)
