"""The public Store and ThreadStore conformance suites over PostgresStore and RedisStore,
against real servers; a peer is a second store object (its own connection pool)."""

from __future__ import annotations

from typing import Any

import pytest

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
        async def make(*, archive_retention: float | None = None) -> PostgresStore:
            return PostgresStore(
                postgres_url, schema=postgres_schema, archive_retention=archive_retention
            )

        return make

    async def open_peer(self, store: Any) -> Any:
        return PostgresStore(store.url, schema=store.schema)


class _Redis:
    @pytest.fixture
    def make_store(self, redis_url: str, redis_prefix: str) -> StoreFactory:
        async def make(*, archive_retention: float | None = None) -> RedisStore:
            return RedisStore(redis_url, prefix=redis_prefix, archive_retention=archive_retention)

        return make

    async def open_peer(self, store: Any) -> Any:
        return RedisStore(store.url, prefix=store.prefix)


class TestPostgresStoreContract(_Postgres, StoreConformance):
    """PostgresStore keeps the whole Store contract."""


class TestPostgresThreadStore(_Postgres, ThreadStoreConformance):
    """PostgresStore keeps the whole ThreadStore contract, across two connection pools."""


class TestRedisStoreContract(_Redis, StoreConformance):
    """RedisStore keeps the whole Store contract."""


class TestRedisThreadStore(_Redis, ThreadStoreConformance):
    """RedisStore keeps the whole ThreadStore contract, across two clients."""
