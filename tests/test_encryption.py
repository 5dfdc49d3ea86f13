"""EncryptedStore: bodies encrypted at rest on every store, the contracts kept, keys rotated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from tinyctx import ConfigError, MemoryStore, SqliteStore, UserMessage, codec
from tinyctx.backends.postgres import PostgresStore
from tinyctx.backends.redis import RedisStore
from tinyctx.encryption import MARK, DecryptionFailed, EncryptedStore
from tinyctx.testing.store_conformance import (
    StoreConformance,
    StoreFactory,
    ThreadStoreConformance,
)
from tinyctx.threads import ThreadWrite

KEY = Fernet.generate_key()


class _Memory:
    @pytest.fixture
    def make_store(self) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> EncryptedStore:
            return EncryptedStore(
                MemoryStore(archive_retention=archive_retention, ttl=ttl), keys=[KEY]
            )

        return make


class _Sqlite:
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> EncryptedStore:
            inner = SqliteStore(tmp_path / "enc.db", archive_retention=archive_retention, ttl=ttl)
            return EncryptedStore(inner, keys=[KEY])

        return make

    async def open_peer(self, store: Any) -> Any:
        return EncryptedStore(SqliteStore(store.inner.path), keys=[KEY])


class _Postgres:
    @pytest.fixture
    def make_store(self, postgres_url: str, postgres_schema: str) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> EncryptedStore:
            inner = PostgresStore(
                postgres_url, schema=postgres_schema, archive_retention=archive_retention, ttl=ttl
            )
            return EncryptedStore(inner, keys=[KEY])

        return make

    async def open_peer(self, store: Any) -> Any:
        inner = store.inner
        return EncryptedStore(PostgresStore(inner.url, schema=inner.schema), keys=[KEY])


class _Redis:
    @pytest.fixture
    def make_store(self, redis_url: str, redis_prefix: str) -> StoreFactory:
        async def make(
            *, archive_retention: float | None = None, ttl: float | None = None
        ) -> EncryptedStore:
            inner = RedisStore(
                redis_url, prefix=redis_prefix, archive_retention=archive_retention, ttl=ttl
            )
            return EncryptedStore(inner, keys=[KEY])

        return make

    async def open_peer(self, store: Any) -> Any:
        inner = store.inner
        return EncryptedStore(RedisStore(inner.url, prefix=inner.prefix), keys=[KEY])


class TestEncryptedMemoryStore(_Memory, StoreConformance):
    """Encrypted MemoryStore keeps the Store contract."""


class TestEncryptedMemoryThreads(_Memory, ThreadStoreConformance):
    """Encrypted MemoryStore keeps the ThreadStore contract."""


class TestEncryptedSqliteThreads(_Sqlite, ThreadStoreConformance):
    """Encrypted SqliteStore keeps the ThreadStore contract."""


class TestEncryptedPostgresThreads(_Postgres, ThreadStoreConformance):
    """Encrypted PostgresStore keeps the ThreadStore contract."""


class TestEncryptedRedisThreads(_Redis, ThreadStoreConformance):
    """Encrypted RedisStore keeps the ThreadStore contract."""


class TestAtRest:
    """What the inner store holds is ciphertext; keys rotate; bad keys are named."""

    async def test_the_inner_store_holds_no_plaintext(self) -> None:
        """Messages, checkpoint, state, notes and values are sealed; ids and versions not."""
        inner = MemoryStore()
        store = EncryptedStore(inner, keys=[KEY])
        docs = codec.encode_messages([UserMessage("my card is 4111")])
        await store.write(
            "t", ThreadWrite(docs, checkpoint="cp 4111", state="st 4111"), expected_version=0
        )
        await store.append_note("ns", "note 4111", metadata={"kind": "fact"})
        await store.put("ns", "k", {"secret": 4111})
        raw = await inner.load_thread("t")
        assert raw.version == 1
        for value in (*raw.messages, raw.checkpoint, raw.state):
            assert value is not None
            assert value.startswith(MARK)
            assert "4111" not in value
        (note,) = await inner.notes("ns")
        assert "4111" not in note.text
        assert dict(note.metadata) == {"kind": "fact"}
        assert "4111" not in str(await inner.get("ns", "k"))
        assert (await store.load_thread("t")).messages == docs
        assert (await store.notes("ns"))[0].text == "note 4111"
        assert await store.get("ns", "k") == {"secret": 4111}

    async def test_rotation_reads_old_and_writes_new(self) -> None:
        """keys=[new, old] reads the old data; rotate_thread rewrites it under new, and
        then the old key may go; a value no key opens raises DecryptionFailed."""
        inner = MemoryStore()
        old, new = KEY, Fernet.generate_key()
        docs = codec.encode_messages([UserMessage("hello")])
        await EncryptedStore(inner, keys=[old]).write("t", ThreadWrite(docs), expected_version=0)
        both = EncryptedStore(inner, keys=[new, old])
        assert (await both.load_thread("t")).messages == docs
        assert await both.rotate_thread("t") == 2
        only_new = EncryptedStore(inner, keys=[new])
        assert (await only_new.load_thread("t")).messages == docs
        with pytest.raises(DecryptionFailed, match="archive"):
            await only_new.archived("t")  # the archived log is still under the old key

    def test_bad_keys_are_config_errors(self) -> None:
        """No keys, or a key that is not a Fernet key, names the field (never the key)."""
        with pytest.raises(ConfigError, match="keys"):
            EncryptedStore(MemoryStore(), keys=[])
        with pytest.raises(ConfigError, match=r"keys\[0\]") as info:
            EncryptedStore(MemoryStore(), keys=[b"short"])
        assert "short" not in str(info.value)
