"""The ThreadStore and Store conformance suites over MemoryStore (and SQLite: see below)."""

from __future__ import annotations

import pytest

from tinyctx import ConfigError, MemoryStore
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
