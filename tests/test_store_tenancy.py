"""Tenants on one server never reach each other's data, and no store ever shows a secret:
Redis key layout (injective over prefixes and names, versioned, migrated), PostgreSQL
schema names (quoted, system schemas refused), password redaction in every URL form, and a
refused PostgreSQL login named as such. Real PostgreSQL and Redis where a server matters."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tinyctx import Agent, ConfigError, Session
from tinyctx.backends._common import redact_url
from tinyctx.backends._postgres_schema import MIGRATIONS, Statements
from tinyctx.backends.postgres import PostgresStore, check_schema
from tinyctx.backends.redis import SCHEMA_VERSION as REDIS_LAYOUT
from tinyctx.backends.redis import RedisStore
from tinyctx.stores import StoreAuthenticationFailed, StoreClosed, StoreSchemaError
from tinyctx.testing import ScriptedModel, capture_events
from tinyctx.threads import ThreadWrite

_FIXTURES = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
# a prefix is any text without "{"; a name (thread id, namespace) any text at all
_PREFIX_TEXT = st.text(st.characters(blacklist_characters="{", blacklist_categories=("Cs",)))
_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_THREAD_IDS = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
_KINDS = st.sampled_from(["kv", "n", "t", "m", "a", "l", "threads", "fencing"])


@contextlib.asynccontextmanager
async def _redis(url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(url, prefix=prefix)
    try:
        yield store
    finally:
        await store.aclose()


def _redis_keys(url: str, match: str) -> set[str]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return set(client.scan_iter(match=match, count=1000))
    finally:
        client.close()


class TestRedisKeyLayout:
    """No (prefix, thread id) pair names another's key, so nested prefixes stay apart."""

    @given(
        first=st.tuples(_PREFIX_TEXT.filter(bool), _KINDS, _NAMES),
        second=st.tuples(_PREFIX_TEXT.filter(bool), _KINDS, _NAMES),
        nest=st.booleans(),
    )
    @example(first=("acme:", "m", "m:x"), second=("m:", "m", "x"), nest=True)  # issue 32
    @example(first=("a:", "t", "x"), second=("t:", "threads", ""), nest=True)
    def test_the_layout_is_injective(
        self, first: tuple[str, str, str], second: tuple[str, str, str], nest: bool
    ) -> None:
        """Two keys are equal only for the same prefix, kind and name, nested prefixes and
        the layout-version key included."""
        if nest:  # the case that collided: one tenant's prefix starts another's
            second = (first[0] + second[0], second[1], second[2])
        stores = [RedisStore("redis://127.0.0.1:1/0", prefix=p) for p, _, _ in (first, second)]
        keys = [store._key(kind, name) for store, (_, kind, name) in zip(stores, (first, second))]
        assert (keys[0] == keys[1]) == (first == second)
        for store, key in zip(stores, keys):
            assert key.startswith(store.prefix)
        markers = {store.prefix + "schema" for store in stores}
        assert not markers & set(keys)

    def test_a_prefix_with_a_brace_is_refused(self) -> None:
        """'{' ends a prefix in the layout, so a prefix holding one is a ConfigError."""
        with pytest.raises(ConfigError, match=r"RedisStore\.prefix=.*without '\{'"):
            RedisStore("redis://127.0.0.1:1/0", prefix="app{1}:")

    async def test_the_reported_nested_tenants_stay_apart(
        self, redis_url: str, redis_prefix: str
    ) -> None:
        """Tenant A on 'acme:' with thread 'm:x' neither reads, appends to nor leases tenant
        B's thread 'x' on 'acme:m:' (the case of issue 32)."""
        outer, inner = redis_prefix + "acme:", redis_prefix + "acme:m:"
        async with _redis(redis_url, outer) as a, _redis(redis_url, inner) as b:
            lease = await b.acquire_lease("x", "tenant-b", 60)
            await b.write("x", ThreadWrite(["b-secret"]), expected_version=0, lease=lease)
            await b.put("m", "k", "b-value")
            forged = await a.load_thread("m:x")
            assert (forged.version, forged.messages, forged.lease) == (0, (), None)
            assert await a.write("m:x", ThreadWrite(["a-wrote"]), expected_version=0) == 1
            await a.acquire_lease("m:x", "tenant-a", 60)
            record = await b.load_thread("x")
            assert (record.version, record.messages, record.lease) == (1, ("b-secret",), lease)
            assert await a.list_threads() == ["m:x"] and await b.list_threads() == ["x"]
            assert await a.get("m:m", "k") is None and await a.keys("m:m") == []

    async def test_a_scan_of_one_prefix_lists_only_its_keys(
        self, redis_url: str, redis_prefix: str
    ) -> None:
        """SCAN MATCH <prefix>{* finds every key of that store and none of a nested one."""
        outer, inner = redis_prefix + "t:", redis_prefix + "t:x:"
        async with _redis(redis_url, outer) as a, _redis(redis_url, inner) as b:
            for store in (a, b):
                await store.write("x", ThreadWrite(["m"]), expected_version=0)
                await store.put("ns", "k", 1)
                await store.append_note("ns", "n")
            for store in (a, b):
                found = _redis_keys(redis_url, store.prefix + "{*")
                assert found == {
                    store._key(kind, name)
                    for kind, name in [("t", "x"), ("m", "x"), ("threads", ""), ("kv", "ns")]
                    + [("n", "ns")]
                }

    @_FIXTURES
    @given(
        outer=_PREFIX_TEXT.filter(bool),
        extra=_PREFIX_TEXT.filter(bool),
        ids=st.tuples(_THREAD_IDS, _THREAD_IDS),
    )
    @example(outer="acme:", extra="m:", ids=("m:x", "x"))  # issue 32
    async def test_nested_prefixes_never_share_a_thread(
        self, redis_url: str, redis_prefix: str, outer: str, extra: str, ids: tuple[str, str]
    ) -> None:
        """For any prefix, any prefix it starts, and any two thread ids (real Redis): a write
        and a lease on one store's thread are invisible to the other's, and neither lists
        the other's threads."""
        first, second = redis_prefix + outer, redis_prefix + outer + extra
        async with _redis(redis_url, first) as a, _redis(redis_url, second) as b:
            await a.write(ids[0], ThreadWrite(["from-a"]), expected_version=0)
            await a.acquire_lease(ids[0], "a", 60)
            record = await b.load_thread(ids[1])
            assert (record.version, record.messages, record.lease) == (0, (), None)
            assert await b.list_threads() == []
            await b.write(ids[1], ThreadWrite(["from-b"]), expected_version=0)
            assert (await a.load_thread(ids[0])).messages == ("from-a",)
            assert await a.list_threads() == [ids[0]]
            for store in (a, b):
                await store.delete_thread(ids[0] if store is a else ids[1])


class TestRedisLayoutUpgrade:
    """Data in the old layout is neither read as the new one nor lost: refused, then moved."""

    def _write_v1(self, url: str, prefix: str) -> None:
        """A prefix as tinyctx wrote it before layout 2: one thread (leased), a value, notes."""
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            client.set(prefix + "schema", 1)
            client.hset(prefix + "t:th", mapping={"v": 2, "st": "state"})
            client.rpush(prefix + "m:th", "d1", "d2")
            client.zadd(prefix + "threads", {"th": 0})
            client.set(prefix + "fencing", 41)
            client.hset(prefix + "kv:ns", "k", '"kept"')
            client.rpush(prefix + "n:ns*1", '[1.0,{},"note"]')
        finally:
            client.close()

    async def test_a_version_1_prefix_is_refused_untouched(
        self, redis_url: str, redis_prefix: str
    ) -> None:
        """Opening a prefix in layout 1 raises StoreSchemaError naming migrate_layout, and
        writes nothing."""
        self._write_v1(redis_url, redis_prefix)
        before = _redis_keys(redis_url, redis_prefix + "*")
        async with _redis(redis_url, redis_prefix) as store:
            with pytest.raises(StoreSchemaError, match=r"layout version 1.*migrate_layout\(\)"):
                await store.load_thread("th")
        assert _redis_keys(redis_url, redis_prefix + "*") == before

    async def test_migrate_layout_moves_everything_over(
        self, redis_url: str, redis_prefix: str
    ) -> None:
        """migrate_layout() renames every key; the thread, values, notes and the fencing
        counter read back as they were, and running it again does nothing."""
        self._write_v1(redis_url, redis_prefix)
        async with _redis(redis_url, redis_prefix) as store:
            assert await store.migrate_layout() == 6
            assert await store.migrate_layout() == 0
            record = await store.load_thread("th")
            assert (record.version, record.messages, record.state) == (2, ("d1", "d2"), "state")
            assert await store.list_threads() == ["th"]
            assert await store.get("ns", "k") == "kept"
            assert [n.text for n in await store.notes("ns*1")] == ["note"]
            assert (await store.acquire_lease("th", "w", 30)).token == 42
            assert await store.schema_version() == REDIS_LAYOUT
        left = _redis_keys(redis_url, redis_prefix + "*")
        assert all(key.startswith(redis_prefix + "{") for key in left - {redis_prefix + "schema"})


def _pg_drop(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


_OBJECTS = re.compile(
    r"(\S*)\.(kv|note_seq|notes|threads|messages|archive|leases|fencing|schema_version|"
    r"write_thread|acquire_lease|delete_thread)\b"
)
_SCHEMAS = st.from_regex(r"[a-z_][a-z0-9_]{0,62}", fullmatch=True).filter(
    lambda name: not name.startswith("pg_") and name != "information_schema"
)


class TestPostgresSchemaNames:
    """A schema name is quoted (reserved words work) and never one of the server's own."""

    @given(schema=_SCHEMAS)
    def test_every_statement_names_only_its_own_schema(self, schema: str) -> None:
        """For any schema name, every table, sequence and function that any statement or
        migration names is qualified by that schema, quoted: no statement reaches a table
        by search_path or through another schema."""
        quoted = check_schema(schema)
        assert quoted == f'"{schema}"'
        texts = [text for text in vars(Statements(quoted)).values() if isinstance(text, str)]
        texts += [sql.replace("{s}", quoted) for step in MIGRATIONS for sql in step]
        for text in texts:
            for qualifier, _name in _OBJECTS.findall(text):
                assert qualifier.endswith(quoted), (qualifier, text[:80])
            bare = re.findall(r"(?:FROM|INTO|UPDATE|JOIN|TABLE|ON)\s+(kv|notes|threads)\b", text)
            assert not bare, text[:80]

    @pytest.mark.parametrize(
        "schema", ["information_schema", "pg_catalog", "pg_toast", "pg_temp_1", "pg_mine"]
    )
    def test_system_schemas_are_refused(self, schema: str) -> None:
        """pg_* and information_schema are a ConfigError naming schema and the rule."""
        with pytest.raises(ConfigError, match=r"PostgresStore\.schema=.*not a system schema"):
            PostgresStore("postgresql://u@127.0.0.1:1/db", schema=schema)

    async def test_reserved_words_are_schemas_like_any_other(self, postgres_url: str) -> None:
        """Stores on 'user', 'select' and 'order' open, keep data and stay apart."""
        names = ["user", "select", "order"]
        stores = [PostgresStore(postgres_url, schema=name) for name in names]
        try:
            for index, store in enumerate(stores):
                await store.write("t", ThreadWrite([f"doc-{index}"]), expected_version=0)
                await store.put("ns", "k", index)
            for index, store in enumerate(stores):
                assert (await store.load_thread("t")).messages == (f"doc-{index}",)
                assert await store.get("ns", "k") == index
                assert await store.schema_version() > 0
        finally:
            for store in stores:
                await store.aclose()
            for name in names:
                _pg_drop(postgres_url, name)


# -- secrets -----------------------------------------------------------------------------

_PASSWORDS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=3
)


def _urls(password: str) -> dict[str, tuple[str, str]]:
    """Every form a driver reads a password from: (store kind, URL)."""
    enc = quote(password, safe="")
    libpq = password.replace("\\", "\\\\").replace("'", "\\'")
    return {
        "pg userinfo": ("pg", f"postgresql://app:{enc}@db.example:5432/prod"),
        "pg query": ("pg", f"postgresql://app@db.example:5432/prod?password={enc}&sslmode=prefer"),
        "pg encoded name": ("pg", f"postgres://app@db.example/prod?pass%77ord={enc}"),
        "pg key=value": ("pg", f"host=db.example port=5432 user=app password='{libpq}' dbname=p"),
        "pg sslpassword": ("pg", f"host=db.example sslpassword='{libpq}' user=app"),
        "redis userinfo": ("redis", f"redis://:{enc}@cache.example:6379/2"),
        "redis user and password": ("redis", f"rediss://app:{enc}@cache.example:6380/0"),
        "redis query": ("redis", f"redis://cache.example:6379/0?password={enc}"),
        "redis unix": ("redis", f"unix:///run/redis.sock?db=1&password={enc}"),
    }


def _store(kind: str, url: str) -> Any:
    return PostgresStore(url) if kind == "pg" else RedisStore(url)


async def _shown(kind: str, url: str) -> list[str]:
    """Everything a store says about itself: its repr, and a closed store's error."""
    store = _store(kind, url)
    texts = [repr(store), str(store)]
    await store.aclose()
    with pytest.raises(StoreClosed) as caught:
        await store.get("ns", "k")
    return [*texts, repr(store), str(caught.value)]


class TestSecretsNeverShown:
    """No repr, error or event ever carries a password, whatever the URL form."""

    @given(password=_PASSWORDS, other=_PASSWORDS, form=st.sampled_from(sorted(_urls("x"))))
    async def test_what_a_store_shows_does_not_depend_on_the_password(
        self, password: str, other: str, form: str
    ) -> None:
        """For any password and URL form, repr(store) and StoreClosed read the same as with
        any other password, and neither the password nor its encoding is in them."""
        kind, url = _urls(password)[form]
        shown = await _shown(kind, url)
        assert shown == await _shown(*_urls(other)[form])
        reference = "\n".join(await _shown(*_urls("\x01")[form]))
        for secret in {password, quote(password, safe="")}:
            assume(secret not in reference)
            assert all(secret not in text for text in shown)

    @given(password=_PASSWORDS.filter(lambda p: not any(c.isspace() or c in "'\\=" for c in p)))
    def test_an_unparsable_connection_string_is_refused_without_its_password(
        self, password: str
    ) -> None:
        """A key=value string libpq refuses is a ConfigError whose message hides the
        password (libpq's own message may quote a piece of the string)."""

        def refusal(secret: str) -> str:
            with pytest.raises(ConfigError, match=r"PostgresStore\.url=") as caught:
                PostgresStore(f"host=db.example password={secret} {secret}")
            return str(caught.value)

        shown = refusal(password)
        assert shown == refusal("Zq9")
        assume(password not in refusal("Zq9"))
        assert password not in shown

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            ("postgresql://u:p@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
            ("host=h password=s3cr3t port=1", "host=h password=*** port=1"),
            ("redis://h/0?password=pw&db=1", "redis://h/0?password=***&db=1"),
            ("postgresql://h/db", "postgresql://h/db"),
        ],
    )
    def test_redaction_keeps_where_the_store_points(self, url: str, shown: str) -> None:
        """Hosts, ports, users and other options stay readable; only secrets go."""
        assert redact_url(url) == shown

    async def test_events_of_a_failing_session_hold_no_password(self, postgres_url: str) -> None:
        """A session whose PostgreSQL store fails mid-thread reports it in events and an
        error, for each URL form, without the password (the test server trusts loopback,
        so any password logs in)."""
        parts = urlsplit(postgres_url)
        secret = "Pa55-w0rd-never-shown"
        urls = [
            postgres_url.replace("postgres@", f"postgres:{secret}@"),
            postgres_url + f"?password={secret}",
            f"host={parts.hostname} port={parts.port} user=postgres dbname=postgres "
            f"password='{secret}'",
        ]
        for url in urls:
            store = PostgresStore(url, schema="t_storesec_events")
            try:
                agent = Agent(model=ScriptedModel(["one", "two"]))
                with capture_events() as events:
                    with pytest.raises(StoreClosed) as caught:
                        async with Session(agent, thread_id="t", store=store) as session:
                            await session.run("first")
                            await store.aclose()
                            await session.run("second")
                assert events and secret not in repr(events)
                assert secret not in str(caught.value) and secret not in repr(caught.value)
            finally:
                await store.aclose()
                _pg_drop(postgres_url, "t_storesec_events")


class TestLoginRefused:
    """A login the server refuses is named as such, not as a pool timeout."""

    async def test_an_unknown_user_names_user_host_and_port(self, postgres_url: str) -> None:
        """StoreAuthenticationFailed says authentication failed for which user at which host
        and port, and never shows the password."""
        parts = urlsplit(postgres_url)
        url = postgres_url.replace("postgres@", "nobody_storesec:Hunter2-secret@")
        store = PostgresStore(url, timeout=1)
        try:
            with pytest.raises(StoreAuthenticationFailed) as caught:
                await store.open()
        finally:
            await store.aclose()
        text = str(caught.value)
        assert "authentication failed" in text and "'nobody_storesec'" in text
        assert f"{parts.hostname}:{parts.port}" in text
        assert "Hunter2" not in text
