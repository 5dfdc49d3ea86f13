"""The public Store and ThreadStore conformance suites over PostgresStore and RedisStore,
against real servers; a peer is a second store object (its own connection pool)."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import psycopg
import pytest
import redis

from tinyctx.backends.postgres import PostgresStore
from tinyctx.backends.redis import RedisStore
from tinyctx.testing.store_conformance import (
    StoreConformance,
    StoreFactory,
    ThreadStoreConformance,
)


class _Postgres:
    @pytest.fixture
    def make_store(self, postgres_url: str, postgres_schema: str) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> PostgresStore:
            return PostgresStore(
                postgres_url, schema=postgres_schema, archive_retention=archive_retention, ttl=ttl
            )

        return make

    async def open_peer(self, store: Any) -> Any:
        return PostgresStore(store.url, schema=store.schema)

    async def stored_traces(self, store: Any, thread_id: str) -> list[str]:
        """Every row of every table of the store's schema that names ``thread_id``."""

        def look() -> list[str]:
            with psycopg.connect(store.url) as conn:
                tables = conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (store.schema,),
                ).fetchall()
                return [
                    f"{table}: {row!r:.80}"
                    for (table,) in tables
                    for row in conn.execute(f'SELECT * FROM "{store.schema}"."{table}"')
                    if thread_id in repr(row)
                ]

        return await anyio.to_thread.run_sync(look)


class _Redis:
    @pytest.fixture
    def make_store(self, redis_url: str, redis_prefix: str) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> RedisStore:
            return RedisStore(
                redis_url, prefix=redis_prefix, archive_retention=archive_retention, ttl=ttl
            )

        return make

    async def open_peer(self, store: Any) -> Any:
        return RedisStore(store.url, prefix=store.prefix)

    async def stored_traces(self, store: Any, thread_id: str) -> list[str]:
        """Every key of the store's prefix named by ``thread_id`` or holding it (hash
        fields, set and sorted-set members)."""

        def look() -> list[str]:
            client = redis.Redis.from_url(store.url, decode_responses=True)
            try:
                found = []
                for key in client.scan_iter(match=store.prefix + "*"):
                    kind = client.type(key)
                    members: list[str] = []
                    if kind == "hash":
                        members = list(client.hkeys(key))
                    elif kind == "zset":
                        members = list(client.zrange(key, 0, -1))
                    elif kind == "set":
                        members = list(client.smembers(key))
                    if thread_id in key or any(thread_id in m for m in members):
                        found.append(key)
                return found
            finally:
                client.close()

        return await anyio.to_thread.run_sync(look)


class TestPostgresStoreContract(_Postgres, StoreConformance):
    """PostgresStore keeps the whole Store contract."""


class TestPostgresThreadStore(_Postgres, ThreadStoreConformance):
    """PostgresStore keeps the whole ThreadStore contract, across two connection pools."""


class TestRedisStoreContract(_Redis, StoreConformance):
    """RedisStore keeps the whole Store contract."""


class TestRedisThreadStore(_Redis, ThreadStoreConformance):
    """RedisStore keeps the whole ThreadStore contract, across two clients."""
