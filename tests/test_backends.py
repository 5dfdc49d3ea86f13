"""PostgresStore and RedisStore beyond the shared contract: configuration, the install hint,
schema migration, closing, worker threads, and the ThreadStore guarantees many workers rely
on (fencing, optimistic versions, atomic writes) against real servers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import make_backend, start_services, stop_services, unique_name
from tinyctx import ConfigError, MemoryStore
from tinyctx.backends.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
from tinyctx.backends.postgres import PostgresStore
from tinyctx.backends.redis import RedisStore
from tinyctx.stores import StoreClosed, StoreSchemaError, StoreUnavailable, append_notes
from tinyctx.threads import (
    Compaction,
    FencedOut,
    LeaseHeld,
    StaleThreadVersion,
    ThreadStore,
    ThreadWrite,
)

NETWORKED = ["postgres", "redis"]


@pytest.fixture(params=NETWORKED)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    store = make_backend(request.param, request, tmp_path)
    yield store
    await store.aclose()


class TestConfiguration:
    """Bad configuration fails at construction, naming the field; URLs never leak passwords."""

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"url": ""}, "url"),
            ({"url": 5}, "url"),
            ({"url": "postgresql://h/db?bogus_option=1"}, "url"),
            ({"schema": "Bad-Name"}, "schema"),
            ({"schema": "1abc"}, "schema"),
            ({"pool_size": 0}, "pool_size"),
            ({"pool_size": 2.5}, "pool_size"),
            ({"timeout": 0}, "timeout"),
            ({"timeout": float("nan")}, "timeout"),
            ({"archive_retention": -1}, "archive_retention"),
        ],
    )
    def test_postgres_rejects_bad_options(self, kwargs: dict[str, Any], field: str) -> None:
        """Each invalid PostgresStore option is a ConfigError naming that option."""
        args = {"url": "postgresql://u@127.0.0.1:1/db", **kwargs}
        url = args.pop("url")
        with pytest.raises(ConfigError, match=rf"PostgresStore\.{field}=") as caught:
            PostgresStore(url, **args)
        assert caught.value.field == field

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"url": "http://localhost:6379"}, "url"),
            ({"url": None}, "url"),
            ({"prefix": ""}, "prefix"),
            ({"max_connections": 0}, "max_connections"),
            ({"timeout": -1}, "timeout"),
            ({"archive_retention": -0.5}, "archive_retention"),
        ],
    )
    def test_redis_rejects_bad_options(self, kwargs: dict[str, Any], field: str) -> None:
        """Each invalid RedisStore option is a ConfigError naming that option."""
        args = {"url": "redis://127.0.0.1:1/0", **kwargs}
        url = args.pop("url")
        with pytest.raises(ConfigError, match=rf"RedisStore\.{field}=") as caught:
            RedisStore(url, **args)
        assert caught.value.field == field

    def test_reprs_hide_the_password(self) -> None:
        """A store's repr shows where it points, never the password in its URL."""
        pg = PostgresStore("postgresql://app:s3cret@db.example:5432/prod")
        rd = RedisStore("redis://:s3cret@cache.example:6379/2")
        assert "s3cret" not in repr(pg) and "app:***@db.example:5432" in repr(pg)
        assert "s3cret" not in repr(rd) and ":***@cache.example:6379" in repr(rd)
        assert "unopened" in repr(pg) and "unopened" in repr(rd)

    @pytest.mark.parametrize(
        ("module", "blocked", "extra"),
        [
            ("tinyctx.backends.postgres", "psycopg", "postgres"),
            ("tinyctx.backends.redis", "redis", "redis"),
        ],
    )
    def test_a_missing_driver_names_the_extra_to_install(
        self, module: str, blocked: str, extra: str
    ) -> None:
        """Without its driver the module imports; constructing a store names the pip install."""
        store = "PostgresStore" if extra == "postgres" else "RedisStore"
        program = (
            f"import sys; sys.modules[{blocked!r}] = None\n"
            f"from {module} import {store}\n"
            f"try:\n    {store}('redis://x' if {extra!r} == 'redis' else 'postgresql://x')\n"
            "except ImportError as exc:\n    print(exc)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert f"pip install 'tinyctx[{extra}]'" in done.stdout


class TestLifecycle:
    """Opening, closing and where the driver calls run."""

    async def test_calls_never_run_on_the_event_loop_thread(self, backend: Any) -> None:
        """Every driver call runs in a worker thread, on trio and asyncio alike."""
        loop_thread = threading.get_ident()
        seen: set[int] = set()
        original = backend._threads.client

        def spy() -> Any:
            seen.add(threading.get_ident())
            return original()

        backend._threads.client = spy
        await backend.put("ns", "k", 1)
        await backend.write("t", ThreadWrite(append=["m"]), expected_version=0)
        assert (await backend.load_thread("t")).messages == ("m",)
        assert seen and loop_thread not in seen

    async def test_a_closed_store_refuses_work(self, backend: Any) -> None:
        """After aclose() every call raises StoreClosed; closing twice is fine."""
        await backend.put("ns", "k", 1)
        await backend.aclose()
        await backend.aclose()
        with pytest.raises(StoreClosed):
            await backend.get("ns", "k")
        with pytest.raises(StoreClosed):
            await backend.load_thread("t")
        assert "closed" in repr(backend)

    async def test_both_implement_thread_store(self, backend: Any) -> None:
        """The networked stores are ThreadStores."""
        assert isinstance(backend, ThreadStore)

    async def test_an_unreachable_server_is_store_unavailable_caused_by_the_drivers_error(
        self,
    ) -> None:
        """A server nobody listens on fails the first call with StoreUnavailable, whose
        cause is the driver's connection error."""
        port = _closed_port()
        pg = PostgresStore(f"postgresql://u@127.0.0.1:{port}/db", timeout=0.5)
        with pytest.raises(StoreUnavailable) as pg_error:
            await pg.get("ns", "k")
        assert isinstance(pg_error.value.__cause__, psycopg.OperationalError)
        await pg.aclose()
        rd = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.5)
        with pytest.raises(StoreUnavailable) as rd_error:
            await rd.get("ns", "k")
        assert isinstance(rd_error.value.__cause__, redis.ConnectionError)
        await rd.aclose()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class TestStoreLikeMemory:
    """The Store part behaves exactly like MemoryStore for any sequence of operations."""

    @settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("note"), st.sampled_from("ab"), st.text(max_size=8)),
                st.tuples(
                    st.just("batch"),
                    st.sampled_from("ab"),
                    st.lists(st.text(max_size=5), max_size=3),
                ),
                st.tuples(st.just("put"), st.sampled_from("ab"), st.text(max_size=3)),
                st.tuples(st.just("delete"), st.sampled_from("ab"), st.text(max_size=3)),
            ),
            max_size=12,
        ),
        limit=st.one_of(st.none(), st.integers(1, 4)),
    )
    async def test_any_operations(
        self, backend: Any, ops: list[tuple[str, str, Any]], limit: int | None
    ) -> None:
        """Up to 12 operations per example, each example in namespaces of its own."""
        memory = MemoryStore()
        run = uuid.uuid4().hex
        for index, (op, name, arg) in enumerate(ops):
            ns = f"{run}-{name}"
            key = arg.replace("\x00", "") if op in ("put", "delete") else arg
            outcomes = []
            for store in (memory, backend):
                if op == "note":
                    outcomes.append((await store.append_note(ns, arg)).seq)
                elif op == "batch":
                    outcomes.append([n.seq for n in await append_notes(store, ns, arg)])
                elif op == "put":
                    await store.put(ns, key, {"i": index, "v": [arg]})
                    outcomes.append(None)
                else:
                    outcomes.append(await store.delete(ns, key))
            assert outcomes[0] == outcomes[1], (op, ns, arg)
        for name in "ab":
            ns = f"{run}-{name}"
            assert await memory.keys(ns) == await backend.keys(ns)
            for key in await memory.keys(ns):
                assert await memory.get(ns, key) == await backend.get(ns, key)
            mine = [(n.seq, n.text, n.metadata) for n in await memory.notes(ns, limit=limit)]
            theirs = [(n.seq, n.text, n.metadata) for n in await backend.notes(ns, limit=limit)]
            assert mine == theirs


class TestDeleteNotes:
    """delete_notes removes one namespace's notes (one user's data) and nothing else."""

    async def test_delete_notes_of_one_namespace(self, backend: Any) -> None:
        """It reports how many went; other namespaces stay; numbering starts over at 1."""
        await backend.append_notes("user:ada", ["a", "b", "c"])
        await backend.append_note("user:bob", "kept")
        assert await backend.delete_notes("user:ada") == 3
        assert await backend.delete_notes("user:ada") == 0
        assert await backend.notes("user:ada") == []
        assert [n.text for n in await backend.notes("user:bob")] == ["kept"]
        assert (await backend.append_note("user:ada", "again")).seq == 1


def _fork_and_use(store: Any, children: int, backend: str) -> list[int]:
    """Fork ``children`` processes that each load and write the thread through the store
    object they inherited, while the parent does the same; their exit codes (0: every
    load read the right thread, every write was applied or refused as stale)."""

    async def use(who: str) -> None:
        for _ in range(50):
            record = await store.load_thread("t")
            assert record.messages[0] == "first", record
        for _ in range(5):
            version = (await store.load_thread("t")).version
            # another process writing first is the version check at work, not a failure
            with contextlib.suppress(StaleThreadVersion):
                await store.write("t", ThreadWrite(append=[who]), expected_version=version)

    pids = []
    for index in range(children):
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                anyio.run(use, f"child{index}", backend=backend)
            except BaseException as exc:
                print(f"child{index}: {type(exc).__name__}: {exc}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    anyio.run(use, "parent", backend=backend)
    codes = []
    deadline = time.monotonic() + 60
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                codes.append(-9)
                break
            time.sleep(0.02)
    return codes


class TestForkedWorkers:
    """A store opened before a pre-forking server forks (gunicorn --preload) works in
    every child: each connects anew, and the parent's connections are left to the parent."""

    @pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
    def test_a_store_opened_before_fork_works_in_the_children_and_the_parent(
        self, kind: str, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """Two children and the parent load and write one thread through the same store
        object: no process sees another's replies, and every applied write is there."""
        store = make_backend(kind, request, tmp_path)

        async def prepare() -> None:
            await store.write("t", ThreadWrite(append=["first"]), expected_version=0)
            await store.load_thread("t")  # the parent's connection is open and in use

        anyio.run(prepare, backend="trio")
        try:
            assert _fork_and_use(store, 2, "trio") == [0, 0]

            async def check() -> tuple[int, tuple[str, ...]]:
                record = await store.load_thread("t")
                return record.version, tuple(record.messages)

            version, messages = anyio.run(check, backend="trio")
            assert messages[0] == "first" and len(messages) == version
            assert {"parent", "child0", "child1"} >= set(messages[1:])
        finally:
            anyio.run(store.aclose, backend="trio")


class TestServerRestart:
    """A PostgreSQL restart or failover drops the pooled connections; the store goes on."""

    async def test_dropped_connections_retry_reads_and_fail_writes_clearly(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """After the server drops every pooled connection, loads and leases work at once
        (they run again on a fresh connection); a write is not repeated: it fails with the
        driver's error, changes nothing, and the next write goes through."""

        def drop_connections() -> int:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (f"tinyctx-{postgres_schema}",),
                ).fetchall()
            return len(rows)

        async with PostgresStore(postgres_url, schema=postgres_schema, pool_size=2) as store:
            await store.write("t", ThreadWrite(append=["kept"]), expected_version=0)
            assert drop_connections() >= 1
            assert (await store.load_thread("t")).messages == ("kept",)
            assert drop_connections() >= 1
            lease = await store.acquire_lease("t", "worker", 10)
            assert drop_connections() >= 1
            with pytest.raises(psycopg.OperationalError):
                await store.write(
                    "t", ThreadWrite(append=["lost"]), expected_version=1, lease=lease
                )
            assert (await store.load_thread("t")).version == 1
            await store.write("t", ThreadWrite(append=["more"]), expected_version=1, lease=lease)
            assert (await store.load_thread("t")).messages == ("kept", "more")

    async def test_the_url_may_name_the_application(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """Connections say tinyctx-<schema> in pg_stat_activity unless the URL names one."""
        named = f"{postgres_url}?application_name=billing"
        async with PostgresStore(named, schema=postgres_schema) as store:
            await store.list_threads()
            with psycopg.connect(postgres_url) as conn:
                names = {
                    row[0]
                    for row in conn.execute(
                        "SELECT application_name FROM pg_stat_activity"
                    ).fetchall()
                }
        assert "billing" in names


class TestSchema:
    """The schema (PostgreSQL) or key layout (Redis) is created on open, once, and a newer
    one is refused untouched."""

    async def test_many_stores_opening_a_new_schema_at_once_migrate_it_once(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """Eight stores opening one new schema concurrently all open it at the current version."""
        stores = [PostgresStore(postgres_url, schema=postgres_schema) for _ in range(8)]
        async with anyio.create_task_group() as group:
            for store in stores:
                group.start_soon(store.open)
        for store in stores:
            assert await store.schema_version() == PG_SCHEMA_VERSION
            await store.aclose()
        with psycopg.connect(postgres_url) as conn:
            (rows,) = conn.execute(
                f"SELECT count(*) FROM {postgres_schema}.schema_version"
            ).fetchone()  # type: ignore[misc]
        assert rows == 1

    async def test_a_version_1_schema_is_migrated_on_open(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """A schema left at version 1 is brought to the current version and keeps its data."""
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            await store.write("t", ThreadWrite(append=["kept"]), expected_version=0)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"UPDATE {postgres_schema}.schema_version SET version = 1")
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            assert await store.schema_version() == PG_SCHEMA_VERSION
            assert (await store.load_thread("t")).messages == ("kept",)
            assert await store.delete_thread("t") is True

    async def test_a_version_2_schema_gets_lz4_and_reads_its_pglz_rows(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """Migration 3 compresses documents with lz4 (a long thread loads faster); rows
        written before, compressed with pglz, still load, and new rows are lz4."""
        with psycopg.connect(postgres_url) as conn:
            (values,) = conn.execute(  # type: ignore[misc]
                "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
            ).fetchone() or ([],)
        if "lz4" not in (values or []):
            pytest.skip("this PostgreSQL server has no lz4")
        big = json.dumps({"text": "a long tool result line\n" * 4000})  # compressible
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            pass
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # back to version 2
            conn.execute(
                f"ALTER TABLE {postgres_schema}.messages ALTER COLUMN doc SET COMPRESSION pglz"
            )
            conn.execute(f"UPDATE {postgres_schema}.schema_version SET version = 2")

        def compression() -> list[str | None]:
            with psycopg.connect(postgres_url) as conn:
                rows = conn.execute(
                    f"SELECT pg_column_compression(doc) FROM {postgres_schema}.messages "
                    "ORDER BY pos"
                ).fetchall()
            return [row[0] for row in rows]

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {postgres_schema}.threads (thread_id, version, length, updated_at) "
                "VALUES ('t', 1, 1, 0)"
            )
            conn.execute(
                f"INSERT INTO {postgres_schema}.messages (thread_id, pos, doc) VALUES ('t', 0, %s)",
                (big.encode(),),
            )
        assert compression() == ["pglz"]
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            assert await store.schema_version() == PG_SCHEMA_VERSION == 6
            await store.write("t", ThreadWrite(append=[big]), expected_version=1)
            assert (await store.load_thread("t")).messages == (big, big)
        assert compression() == ["pglz", "lz4"]

    async def test_a_role_with_data_rights_only_uses_a_current_schema(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """An application role without DDL rights opens a schema its owner created and
        migrated; one that needs migrating is refused with an error saying what to do."""
        role = f"app_{uuid.uuid4().hex[:8]}"
        s = postgres_schema
        async with PostgresStore(postgres_url, schema=s) as owner:
            await owner.write("t", ThreadWrite(append=["kept"]), expected_version=0)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")
            conn.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {role}"
            )
            conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {role}")
            conn.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {role}")
        app_url = postgres_url.replace("://postgres@", f"://{role}@")
        try:
            async with PostgresStore(app_url, schema=s) as app:
                assert (await app.load_thread("t")).messages == ("kept",)
                lease = await app.acquire_lease("t", "worker", 10)
                await app.write("t", ThreadWrite(append=["more"]), expected_version=1, lease=lease)
            for version, refusal in ((2, "must be created or migrated"), (99, "newer tinyctx")):
                with psycopg.connect(postgres_url, autocommit=True) as conn:
                    conn.execute(f"UPDATE {s}.schema_version SET version = %s", (version,))
                with pytest.raises(StoreSchemaError, match=refusal):
                    await PostgresStore(app_url, schema=s).open()
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f"UPDATE {s}.schema_version SET version = 2")
            async with PostgresStore(postgres_url, schema=s) as owner:  # the owner migrates
                assert await owner.schema_version() == PG_SCHEMA_VERSION
            async with PostgresStore(app_url, schema=s) as app:
                assert (await app.load_thread("t")).messages == ("kept", "more")
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")

    async def test_a_newer_postgres_schema_is_refused_untouched(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """A schema written by a newer tinyctx raises StoreSchemaError and keeps its data."""
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            await store.put("ns", "k", "kept")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"UPDATE {postgres_schema}.schema_version SET version = 99")
        store = PostgresStore(postgres_url, schema=postgres_schema)
        with pytest.raises(StoreSchemaError, match="version 99 was written by a newer tinyctx"):
            await store.get("ns", "k")
        await store.aclose()
        with psycopg.connect(postgres_url) as conn:
            row = conn.execute(f"SELECT value FROM {postgres_schema}.kv").fetchone()
        assert row == ('"kept"',)

    async def test_a_newer_redis_layout_is_refused(self, redis_url: str, redis_prefix: str) -> None:
        """A key layout written by a newer tinyctx raises StoreSchemaError."""
        client = redis.Redis.from_url(redis_url)
        client.set(redis_prefix + "schema", 7)
        client.close()
        store = RedisStore(redis_url, prefix=redis_prefix)
        with pytest.raises(StoreSchemaError, match="layout version 7"):
            await store.open()
        await store.aclose()

    async def test_schemas_and_prefixes_keep_applications_apart(
        self, postgres_url: str, redis_url: str
    ) -> None:
        """Two stores on one server with different schemas/prefixes never see each other's data."""
        for make, cleanup in (
            (
                lambda name: PostgresStore(postgres_url, schema=name),
                lambda name: _drop_pg(postgres_url, name),
            ),
            (
                lambda name: RedisStore(redis_url, prefix=name + ":"),
                lambda name: _drop_redis(redis_url, name + ":"),
            ),
        ):
            names = [unique_name("iso"), unique_name("iso")]
            first, second = make(names[0]), make(names[1])
            try:
                await first.put("ns", "k", 1)
                await first.write("t", ThreadWrite(append=["a"]), expected_version=0)
                assert await second.get("ns", "k") is None
                assert await second.list_threads() == []
                assert (await second.load_thread("t")).version == 0
            finally:
                await first.aclose()
                await second.aclose()
                for name in names:
                    cleanup(name)


def _drop_pg(url: str, schema: str) -> None:
    from tests.servers import drop_postgres_schema

    drop_postgres_schema(url, schema)


def _drop_redis(url: str, prefix: str) -> None:
    from tests.servers import drop_redis_prefix

    drop_redis_prefix(url, prefix)


class TestPostgresText:
    """PostgreSQL text cannot hold NUL: identifiers with one are refused clearly, while
    documents and note texts (stored as bytes) keep every character."""

    async def test_nul_in_an_identifier_is_a_clear_error(
        self, postgres_url: str, postgres_schema: str
    ) -> None:
        """A thread id or namespace containing NUL is a ValueError naming the field."""
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            with pytest.raises(ValueError, match=r"thread_id='a\\x00b' is invalid .*U\+0000"):
                await store.load_thread("a\x00b")
            with pytest.raises(ValueError, match="namespace"):
                await store.put("n\x00", "k", 1)

    async def test_documents_keep_every_character(self, backend: Any) -> None:
        """NUL, emoji and non-BMP text in documents, state and notes come back byte for byte."""
        docs = ["a\x00b", "日本語 ✓ 🦀", "\U0010ffff", ""]
        await backend.write(
            "t", ThreadWrite(append=docs, checkpoint="c\x00", state="s🦀"), expected_version=0
        )
        record = await backend.load_thread("t")
        assert record.messages == tuple(docs)
        assert (record.checkpoint, record.state) == ("c\x00", "s🦀")
        note = await backend.append_note("ns", "x\x00y")
        assert [n.text for n in await backend.notes("ns")] == [note.text] == ["x\x00y"]


class TestAtomicWrites:
    """A refused write (fenced, stale, bad range) leaves the thread exactly as it was."""

    async def test_a_fenced_out_writer_applies_nothing(self, backend: Any) -> None:
        """A compaction + append + checkpoint + state under a replaced lease changes nothing."""
        await backend.write("t", ThreadWrite(append=["m0", "m1", "m2"]), expected_version=0)
        old = await backend.acquire_lease("t", "worker-a", 0.05)
        await anyio.sleep(0.2)  # worker-a's lease expires (a paused or partitioned worker)
        new = await backend.acquire_lease("t", "worker-b", 30)
        assert new.token > old.token
        before = await backend.load_thread("t")
        change = ThreadWrite(
            append=["late"],
            compaction=Compaction(0, 2, ["summary"]),
            checkpoint="cp",
            state="st",
        )
        with pytest.raises(FencedOut) as caught:
            await backend.write("t", change, expected_version=1, lease=old)
        assert (caught.value.token, caught.value.current) == (old.token, new.token)
        after = await backend.load_thread("t")
        assert (after.version, after.messages, after.checkpoint, after.state) == (
            before.version,
            before.messages,
            before.checkpoint,
            before.state,
        )
        assert await backend.archived("t") == []
        assert await backend.write("t", change, expected_version=1, lease=new) == 2

    async def test_stale_and_out_of_range_writes_apply_nothing(self, backend: Any) -> None:
        """A stale version or a compaction outside the log raises and leaves the thread alone."""
        await backend.write("t", ThreadWrite(append=["a", "b"]), expected_version=0)
        with pytest.raises(StaleThreadVersion) as stale:
            await backend.write("t", ThreadWrite(append=["x"], state="s"), expected_version=0)
        assert (stale.value.expected, stale.value.actual) == (0, 1)
        with pytest.raises(ValueError, match=r"compaction range \[1, 5\)"):
            await backend.write(
                "t",
                ThreadWrite(append=["x"], compaction=Compaction(1, 5, ["s"])),
                expected_version=1,
            )
        record = await backend.load_thread("t")
        assert (record.version, record.messages, record.state) == (1, ("a", "b"), None)

    async def test_a_first_write_racing_a_delete_keeps_version_and_log_together(
        self, backend: Any, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """Delete and the first write of a thread, raced 40 times from two clients: whatever
        the order, the thread's version counts exactly the messages it holds."""
        peer = make_backend(request.node.callspec.params["backend"], request, tmp_path)
        try:
            for round_ in range(40):
                thread = f"race-{round_}"

                async def write(thread: str = thread) -> None:
                    await backend.write(thread, ThreadWrite(append=["m"]), expected_version=0)

                async def delete(thread: str = thread) -> None:
                    await peer.delete_thread(thread)

                async with anyio.create_task_group() as group:
                    group.start_soon(delete)
                    group.start_soon(write)
                record = await backend.load_thread(thread)
                assert record.version == len(record.messages), round_
        finally:
            await peer.aclose()

    async def test_a_second_owner_waits_for_the_lease_to_expire(self, backend: Any) -> None:
        """While worker-a's lease is live worker-b gets LeaseHeld naming worker-a; then it wins."""
        lease = await backend.acquire_lease("t", "worker-a", 0.3)
        with pytest.raises(LeaseHeld) as held:
            await backend.acquire_lease("t", "worker-b", 10)
        assert held.value.owner == "worker-a"
        assert held.value.expires_at == pytest.approx(lease.expires_at, abs=0.01)
        await anyio.sleep(0.4)
        taken = await backend.acquire_lease("t", "worker-b", 10)
        assert taken.token > lease.token
        with pytest.raises(FencedOut):
            await backend.renew_lease(lease, 10)
        await backend.release_lease(lease)  # a no-op: replaced
        assert (await backend.load_thread("t")).lease == taken


class TestServices:
    """.ci/services.sh starts real servers on loopback and stops them, leaving nothing."""

    def test_start_and_stop(self, database_servers: Any) -> None:
        """Started servers answer on loopback; stop ends them and removes their directory."""
        if database_servers.postgres is None:
            pytest.skip(database_servers.reason)
        found = start_services()
        directory = Path(found["TINYCTX_SERVICES_DIR"])
        pg_url, redis_url = found["TINYCTX_TEST_POSTGRES_URL"], found["TINYCTX_TEST_REDIS_URL"]
        try:
            assert pg_url.startswith("postgresql://postgres@127.0.0.1:")
            with psycopg.connect(pg_url) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            client = redis.Redis.from_url(redis_url)
            assert client.ping() is True
            client.close()
        finally:
            stop_services(str(directory))
        assert not directory.exists()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg_url, connect_timeout=2)
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
