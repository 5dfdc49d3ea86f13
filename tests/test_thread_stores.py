"""The ThreadStore and Store conformance suites over MemoryStore (and SQLite: see below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tinyctx import ConfigError, MemoryStore, SqliteStore
from tinyctx.testing.store_conformance import StoreFactory, ThreadStoreConformance


async def _memory(*, archive_retention: float | None = None) -> MemoryStore:
    return MemoryStore(archive_retention=archive_retention)


class TestMemoryThreadStore(ThreadStoreConformance):
    """MemoryStore keeps the whole ThreadStore contract."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return _memory


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
        async def make(*, archive_retention: float | None = None) -> SqliteStore:
            return SqliteStore(tmp_path / "threads.db", archive_retention=archive_retention)

        return make

    async def open_peer(self, store: Any) -> Any:
        return SqliteStore(store.path)
