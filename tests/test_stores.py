"""Stores: the Store contract on MemoryStore and SqliteStore, SQLite durability, schema
migration, busy handling and concurrent writers."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import AssistantMessage, ConfigError, MemoryStore, SqliteStore, UserMessage
from tinyctx.backends.sqlite import MIGRATIONS, SCHEMA_VERSION
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.stores import Note, NoteBatchStore, Store, StoreClosed, StoreSchemaError, append_notes
from tinyctx.testing.store_conformance import StoreConformance, StoreFactory
from tinyctx.threads import Compaction, ThreadWrite


async def _memory(
    *, archive_retention: float | None = None, ttl: float | None = None
) -> MemoryStore:
    return MemoryStore(archive_retention=archive_retention, ttl=ttl)


class TestMemoryStoreContract(StoreConformance):
    """MemoryStore keeps the Store contract (the public conformance suite)."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return _memory


class TestSqliteStoreContract(StoreConformance):
    """SqliteStore keeps the Store contract (the public conformance suite)."""

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> SqliteStore:
            return SqliteStore(tmp_path / "s.db", archive_retention=archive_retention, ttl=ttl)

        return make


class TestSqliteMatchesMemory:
    """SqliteStore and MemoryStore agree on any sequence of Store operations."""

    @settings(max_examples=50)
    @given(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("note"), st.sampled_from("ab"), st.text(max_size=8)),
                st.tuples(
                    st.just("batch"),
                    st.sampled_from("ab"),
                    st.lists(st.text(max_size=5), max_size=3),
                ),
                st.tuples(st.just("put"), st.sampled_from("ab"), st.sampled_from("xyz")),
                st.tuples(st.just("delete"), st.sampled_from("ab"), st.sampled_from("xyz")),
            ),
            max_size=12,
        ),
        limit=st.one_of(st.none(), st.integers(1, 4)),
    )
    async def test_sqlite_behaves_like_memory_for_any_operations(
        self, ops: list[tuple[str, str, Any]], limit: int | None
    ) -> None:
        """Example-heavy (a database per example): 50 examples, each with up to 12 ops."""
        memory, sqlite = MemoryStore(), SqliteStore(":memory:")
        try:
            for index, (op, ns, arg) in enumerate(ops):
                outcomes = []
                for store in (memory, sqlite):
                    if op == "note":
                        outcomes.append((await store.append_note(ns, arg)).seq)
                    elif op == "batch":
                        outcomes.append([n.seq for n in await store.append_notes(ns, arg)])
                    elif op == "put":
                        await store.put(ns, arg, {"i": index, "v": [arg]})
                        outcomes.append(None)
                    else:
                        outcomes.append(await store.delete(ns, arg))
                assert outcomes[0] == outcomes[1], (op, ns, arg)
            for ns in "ab":
                assert await memory.keys(ns) == await sqlite.keys(ns)
                for key in await memory.keys(ns):
                    assert await memory.get(ns, key) == await sqlite.get(ns, key)
                mine = [(n.seq, n.text) for n in await memory.notes(ns, limit=limit)]
                theirs = [(n.seq, n.text) for n in await sqlite.notes(ns, limit=limit)]
                assert mine == theirs
        finally:
            await sqlite.aclose()


class TestSqliteStore:
    """SqliteStore: durable, WAL, JSON values, lazily opened, closed for good."""

    async def test_data_survives_reopening_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "memory.db"
        async with SqliteStore(path) as first:
            await first.put("ns", "k", [1, "two"])
            await first.append_note("ns", "remember me", metadata={"x": [1]})
        async with SqliteStore(str(path)) as second:
            assert await second.get("ns", "k") == [1, "two"]
            (note,) = await second.notes("ns")
            assert (note.seq, note.text, note.metadata) == (1, "remember me", {"x": (1,)})
            assert (await second.append_note("ns", "next")).seq == 2

    async def test_the_file_uses_wal_and_the_current_schema(self, tmp_path: Path) -> None:
        path = tmp_path / "w.db"
        async with SqliteStore(path) as store:
            assert await store.schema_version() == SCHEMA_VERSION
        with closing(sqlite3.connect(path)) as raw, raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    async def test_non_json_values_are_refused_before_writing(self, tmp_path: Path) -> None:
        async with SqliteStore(tmp_path / "j.db") as store:
            with pytest.raises(TypeError, match=r"'ns'/'k' must be JSON-serializable"):
                await store.put("ns", "k", {"when": object()})
            with pytest.raises(TypeError, match="JSON-serializable"):
                await store.put("ns", "k", float("nan"))
            with pytest.raises(TypeError, match="note metadata"):
                await store.append_note("ns", "t", metadata={"o": object()})
            assert await store.keys("ns") == []
            assert await store.notes("ns") == []

    async def test_sql_never_runs_on_the_event_loop_thread(self, tmp_path: Path) -> None:
        loop_thread = threading.get_ident()
        seen: set[int] = set()
        async with SqliteStore(tmp_path / "t.db") as store:
            conn = store._conn
            assert conn is not None
            conn.set_trace_callback(lambda sql: seen.add(threading.get_ident()))
            await store.put("ns", "k", 1)
            await store.append_notes("ns", ["a", "b"])
            await store.get("ns", "k")
            await store.notes("ns")
            await store.keys("ns")
            await store.delete("ns", "k")
        assert seen
        assert loop_thread not in seen

    async def test_a_closed_store_refuses_work(self, tmp_path: Path) -> None:
        store = SqliteStore(tmp_path / "c.db")
        await store.put("ns", "k", 1)
        await store.aclose()
        await store.aclose()  # idempotent
        with pytest.raises(StoreClosed, match="closed"):
            await store.get("ns", "k")
        with pytest.raises(StoreClosed):
            await store.append_note("ns", "late")

    def test_bad_configuration_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match=r"SqliteStore\.path"):
            SqliteStore("")
        with pytest.raises(ConfigError, match=r"SqliteStore\.path"):
            SqliteStore(3)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"SqliteStore\.timeout.*> 0"):
            SqliteStore("x.db", timeout=0)
        for bad in (-1, 1.5, True, "64MB"):
            with pytest.raises(ConfigError, match=r"SqliteStore\.cache_bytes.*number of bytes"):
                SqliteStore("x.db", cache_bytes=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match=r"SqliteStore\.mmap_bytes.*number of bytes"):
                SqliteStore("x.db", mmap_bytes=bad)  # type: ignore[arg-type]

    async def test_the_page_cache_is_what_cache_bytes_says(self, tmp_path: Path) -> None:
        """The connection's page cache holds a long thread (64 MiB by default), or what the
        application gives."""

        def cache_kib(conn: sqlite3.Connection) -> int:
            return -int(conn.execute("PRAGMA cache_size").fetchone()[0])

        async with SqliteStore(tmp_path / "a.db") as store:
            assert await store._run(cache_kib) == 64 * 1024
        async with SqliteStore(tmp_path / "b.db", cache_bytes=8 << 20) as store:
            assert await store._run(cache_kib) == 8 * 1024

    @pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
    async def test_the_file_is_not_mapped_unless_asked(self, tmp_path: Path) -> None:
        """Only the page cache holds the file's pages: none of it is memory-mapped (a map
        kept every page read in the RSS, growing with the file past the cache's bound),
        unless ``mmap_bytes`` asks for it."""

        def mmap_size(conn: sqlite3.Connection) -> int:
            return int(conn.execute("PRAGMA mmap_size").fetchone()[0])

        def mapped(path: Path) -> bool:
            with open("/proc/self/smaps") as smaps:
                return any(line.rstrip().endswith(str(path)) for line in smaps)

        path = tmp_path / "threads.db"
        async with SqliteStore(path) as store:
            change = ThreadWrite(encode_messages([UserMessage("hi " * 500)]))
            for index in range(20):
                await store.write(f"t{index}", change, expected_version=0)
                await store.load_thread(f"t{index}")
            assert await store._run(mmap_size) == 0
            assert not mapped(path)
        async with SqliteStore(path, mmap_bytes=1 << 20) as store:
            await store.load_thread("t0")
            assert await store._run(mmap_size) == 1 << 20
            assert mapped(path)

    async def test_an_unopenable_path_raises_what_sqlite_says(self, tmp_path: Path) -> None:
        """SQLite's own error, with the file it could not open and what to check."""
        path = tmp_path / "missing-dir" / "x.db"
        store = SqliteStore(path)
        with pytest.raises(sqlite3.OperationalError, match="unable to open") as info:
            await store.put("ns", "k", 1)
        assert str(path) in str(info.value) and "directory exist" in str(info.value)
        await store.aclose()

    async def test_a_file_that_is_not_sqlite_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "not.db"
        path.write_bytes(b"this is not a database file, not at all" * 100)
        store = SqliteStore(path)
        with pytest.raises(StoreSchemaError, match="not a tinyctx SQLite store"):
            await store.open()
        await store.aclose()


# the schema an older tinyctx (schema version 1) wrote, verbatim
V1_SCHEMA = [
    "CREATE TABLE tinyctx_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "version INTEGER NOT NULL, updated_at REAL NOT NULL)",
    "INSERT INTO tinyctx_schema VALUES (1, 1, 0)",
    "CREATE TABLE tinyctx_kv (namespace TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, PRIMARY KEY (namespace, key)) WITHOUT ROWID",
    "CREATE TABLE tinyctx_notes (namespace TEXT NOT NULL, seq INTEGER NOT NULL, "
    "text TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (namespace, seq))",
]


def _write_v1_file(path: Path) -> None:
    with closing(sqlite3.connect(path)) as raw, raw:
        for statement in V1_SCHEMA:
            raw.execute(statement)
        raw.execute("INSERT INTO tinyctx_kv VALUES ('ns', 'k', '{\"old\":true}')")
        raw.execute("INSERT INTO tinyctx_notes VALUES ('ns', 1, 'old note', 100.0)")
        raw.execute("INSERT INTO tinyctx_notes VALUES ('ns', 2, 'older writer', 101.0)")
    raw.close()


class TestSchemaMigration:
    """Opening an older file migrates it in place; a newer one is refused."""

    async def test_a_version_1_file_is_migrated_on_open_and_keeps_its_data(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "v1.db"
        _write_v1_file(path)
        async with SqliteStore(path) as store:
            assert await store.schema_version() == SCHEMA_VERSION == 7
            assert await store.get("ns", "k") == {"old": True}
            old = await store.notes("ns")
            assert [(n.seq, n.text, n.created_at, n.metadata) for n in old] == [
                (1, "old note", 100.0, {}),
                (2, "older writer", 101.0, {}),
            ]
            new = await store.append_note("ns", "after migration", metadata={"v": 2})
            assert (new.seq, new.metadata) == (3, {"v": 2})
            # version 3 added durable threads to the same file
            change = ThreadWrite(encode_messages([UserMessage("hi")]), state="{}")
            assert await store.write("t", change, expected_version=0) == 1
            assert (await store.load_thread("t")).messages == change.append
        with closing(sqlite3.connect(path)) as raw, raw:
            columns = {row[1] for row in raw.execute("PRAGMA table_info(tinyctx_notes)")}
            version = raw.execute("SELECT version FROM tinyctx_schema").fetchone()[0]
        assert "metadata" in columns
        assert version == 7

    async def test_a_version_5_file_reads_its_versions_without_run_ids(
        self, tmp_path: Path
    ) -> None:
        """Schema 6 adds TTLs, run ids and the layer copies: versions written before read
        back with run_id None and no layers kept; new writes record them."""
        path = tmp_path / "v5.db"
        async with SqliteStore(path) as store:
            await store.write("t", ThreadWrite(("a",), state="s1"), expected_version=0)
        with closing(sqlite3.connect(path)) as raw, raw:  # back to version 5
            for column in ("run_id", "checkpoint_set", "checkpoint", "state"):
                raw.execute(f"ALTER TABLE tinyctx_versions DROP COLUMN {column}")
            raw.execute("ALTER TABLE tinyctx_threads DROP COLUMN ttl")
            raw.execute("ALTER TABLE tinyctx_threads DROP COLUMN state_version")
            raw.execute("UPDATE tinyctx_schema SET version = 5")
        async with SqliteStore(path) as store:
            assert await store.schema_version() == 7
            new = ThreadWrite(("b",), state="s2", run_id="r-2")
            await store.write("t", new, expected_version=1)
            assert [(v.version, v.run_id) for v in await store.versions("t")] == [
                (1, None),
                (2, "r-2"),
            ]
            assert await store.layers_as_of("t", 1) == (None, None)
            assert await store.layers_as_of("t", 2) == (None, "s2")

    async def test_two_stores_opening_an_old_file_migrate_it_once(self, tmp_path: Path) -> None:
        # concurrent first opens race for the exclusive lock the switch to WAL needs; SQLite
        # answers one of them "database is locked" at once (deadlock avoidance, no busy
        # handler), so the store must retry that switch itself
        for round_ in range(8):
            path = tmp_path / f"race-{round_}.db"
            _write_v1_file(path)
            stores = [SqliteStore(path) for _ in range(6)]
            async with anyio.create_task_group() as group:
                for store in stores:
                    group.start_soon(store.open)
            for store in stores:
                assert await store.schema_version() == SCHEMA_VERSION
                assert len(await store.notes("ns")) == 2
                await store.aclose()

    async def test_threads_written_by_version_3_load_and_grow_after_the_migration(
        self, tmp_path: Path
    ) -> None:
        """Version 4 keeps a message's text in a column of its own; rows written before
        (whole documents) load as they were, beside new split rows and compactions."""
        path = tmp_path / "v3.db"
        old_docs = encode_messages(
            [UserMessage("old \u00e9\n  text"), AssistantMessage("old answer")]
        )
        with closing(sqlite3.connect(path)) as raw, raw:
            raw.execute(
                "CREATE TABLE tinyctx_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
                "version INTEGER NOT NULL, updated_at REAL NOT NULL)"
            )
            for statements in MIGRATIONS[:3]:
                for statement in statements:
                    raw.execute(statement)
            raw.execute("INSERT INTO tinyctx_schema VALUES (1, 3, 0)")
            raw.execute(
                "INSERT INTO tinyctx_threads VALUES "
                "('t', 1, 2, 2048, NULL, NULL, NULL, NULL, NULL, 0)"
            )
            raw.executemany(
                "INSERT INTO tinyctx_messages VALUES ('t', ?, ?)",
                [(1024, old_docs[0]), (2048, old_docs[1])],
            )
        raw.close()
        async with SqliteStore(path) as store:
            assert await store.schema_version() == SCHEMA_VERSION == 7
            record = await store.load_thread("t")
            assert record.messages == old_docs
            new_docs = encode_messages([UserMessage("new"), AssistantMessage("new answer")])
            summary = encode_messages([AssistantMessage("summary")])
            await store.write("t", ThreadWrite(new_docs), expected_version=1)
            await store.write(
                "t", ThreadWrite(compaction=Compaction(0, 3, summary)), expected_version=2
            )
            record = await store.load_thread("t")
            assert record.messages == summary + new_docs[1:]
            assert decode_messages(record.messages) == decode_messages(summary + new_docs[1:])
            (archived,) = await store.archived("t")
            assert archived.messages == old_docs + new_docs[:1]
        with closing(sqlite3.connect(path)) as raw, raw:
            stored = raw.execute(
                "SELECT doc, content FROM tinyctx_messages ORDER BY pos"
            ).fetchall()
        raw.close()
        head = '{"content":null,"role":"assistant","v":1}'  # the texts in their column
        assert stored == [(head, "summary"), (head, "new answer")]

    async def test_a_file_migrated_by_a_newer_release_while_open_is_refused_untouched(
        self, tmp_path: Path
    ) -> None:
        """Another process migrating the file past this release stops this store at its next
        transaction (nothing read in a layout it does not know, nothing written); a schema
        change that keeps the version (another process adding an index) does not."""
        path = tmp_path / "shared.db"
        docs = encode_messages([UserMessage("hi"), AssistantMessage("hello")])
        async with SqliteStore(path) as store:
            await store.write("t", ThreadWrite(docs[:1]), expected_version=0)
            with closing(sqlite3.connect(path)) as raw, raw:
                raw.execute("CREATE INDEX tinyctx_notes_age ON tinyctx_notes (created_at)")
            raw.close()
            assert (await store.load_thread("t")).messages == docs[:1]
            with closing(sqlite3.connect(path)) as raw, raw:
                raw.execute("CREATE TABLE tinyctx_future (x INTEGER)")
                raw.execute("UPDATE tinyctx_schema SET version = 99")
            raw.close()
            newer = r"migrated to schema version 99 by a newer tinyctx while this store had it"
            with pytest.raises(StoreSchemaError, match=newer):
                await store.load_thread("t")
            with pytest.raises(StoreSchemaError, match=newer):
                await store.write("t", ThreadWrite(docs[1:]), expected_version=1)
        with closing(sqlite3.connect(path)) as raw, raw:
            version = raw.execute("SELECT version FROM tinyctx_threads").fetchone()[0]
            rows = raw.execute("SELECT count(*) FROM tinyctx_messages").fetchone()[0]
        raw.close()
        assert (version, rows) == (1, 1)

    async def test_a_file_from_a_newer_version_is_refused_untouched(self, tmp_path: Path) -> None:
        path = tmp_path / "new.db"
        async with SqliteStore(path) as store:
            await store.append_note("ns", "x")
        with closing(sqlite3.connect(path)) as raw, raw:
            raw.execute("UPDATE tinyctx_schema SET version = 99")
        raw.close()
        store = SqliteStore(path)
        with pytest.raises(StoreSchemaError, match=r"version 99 was written by a newer tinyctx"):
            await store.notes("ns")
        await store.aclose()
        with closing(sqlite3.connect(path)) as raw, raw:
            assert raw.execute("SELECT version FROM tinyctx_schema").fetchone()[0] == 99
        raw.close()


class TestConcurrentWriters:
    """Many writers on one file lose nothing and never duplicate a sequence number."""

    async def test_200_writers_through_4_stores_on_one_file(self, tmp_path: Path) -> None:
        path = tmp_path / "shared.db"
        stores = [SqliteStore(path) for _ in range(4)]

        async def writer(index: int) -> None:
            store = stores[index % len(stores)]
            await store.append_note("shared", f"single-{index}")
            batch = await store.append_notes("shared", [f"batch-{index}-{k}" for k in range(3)])
            # a batch is one transaction: its numbers are consecutive
            assert [n.seq for n in batch] == list(range(batch[0].seq, batch[0].seq + 3))
            await store.append_note(f"own-{index}", f"mine-{index}")

        async with anyio.create_task_group() as group:
            for index in range(200):
                group.start_soon(writer, index)
        reader = stores[0]
        notes = await reader.notes("shared")
        assert [n.seq for n in notes] == list(range(1, 801))
        expected = {f"single-{i}" for i in range(200)}
        expected |= {f"batch-{i}-{k}" for i in range(200) for k in range(3)}
        assert {n.text for n in notes} == expected
        for index in (0, 57, 199):
            assert [n.text for n in await reader.notes(f"own-{index}")] == [f"mine-{index}"]
        for store in stores:
            await store.aclose()

    async def test_a_writer_waits_for_another_connections_lock(self, tmp_path: Path) -> None:
        path = tmp_path / "busy.db"
        async with SqliteStore(path) as store:
            await store.append_note("ns", "first")
            raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            raw.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            raw.execute("INSERT INTO tinyctx_notes VALUES ('ns', 2, 'theirs', 0, '{}')")
            written: list[Note] = []

            async def write() -> None:
                written.append(await store.append_note("ns", "mine"))

            async with anyio.create_task_group() as group:
                group.start_soon(write)
                await anyio.sleep(0.05)  # let the writer reach the busy lock
                raw.execute("COMMIT")
            raw.close()
            assert written[0].seq == 3
            assert [n.text for n in await store.notes("ns")] == ["first", "theirs", "mine"]

    async def test_busy_past_the_timeout_fails_and_writes_nothing(self, tmp_path: Path) -> None:
        path = tmp_path / "locked.db"
        async with SqliteStore(path, timeout=0.05) as store:
            raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            raw.execute("BEGIN IMMEDIATE")
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    await store.append_notes("ns", ["a", "b"])
            finally:
                raw.execute("ROLLBACK")
                raw.close()
            assert await store.notes("ns") == []
            assert (await store.append_note("ns", "later")).seq == 1


class _OneByOne:
    """A store without append_notes: the helper falls back to one note at a time."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def get(self, namespace: str, key: str) -> Any | None:
        return await self.inner.get(namespace, key)

    async def put(self, namespace: str, key: str, value: Any) -> None:
        await self.inner.put(namespace, key, value)

    async def delete(self, namespace: str, key: str) -> bool:
        return await self.inner.delete(namespace, key)

    async def keys(self, namespace: str) -> list[str]:
        return await self.inner.keys(namespace)

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        return await self.inner.append_note(namespace, text, metadata=metadata)

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        return await self.inner.notes(namespace, limit=limit)

    async def aclose(self) -> None:
        await self.inner.aclose()


class TestAppendNotesHelper:
    """append_notes uses a batch when the store has one, else appends one by one."""

    async def test_fallback_for_a_store_without_batches(self) -> None:
        store = _OneByOne()
        assert isinstance(store, Store) and not isinstance(store, NoteBatchStore)
        notes: Sequence[Note] = await append_notes(store, "ns", ["a", "b"], metadata={"m": 1})
        assert [(n.seq, n.text, n.metadata) for n in notes] == [
            (1, "a", {"m": 1}),
            (2, "b", {"m": 1}),
        ]
