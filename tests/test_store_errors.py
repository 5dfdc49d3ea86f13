"""A SQLite thread row changed outside tinyctx is named (thread, column, what it holds),
never misread as a version or a token."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tinyctx import Agent, Session, SqliteStore
from tinyctx.stores import StoreSchemaError
from tinyctx.testing import ScriptedModel
from tinyctx.threads import ThreadWrite


def _edit(path: Path, statement: str) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(statement)
        conn.commit()


class TestSqliteRowsChangedOutside:
    """A thread row whose integers were replaced by text or a BLOB is named, not misread."""

    @pytest.mark.parametrize(
        ("column", "value", "kind"),
        [
            ("version", "x'01'", "a BLOB"),
            ("version", "'three'", "text"),
            ("version", "1.5", "a REAL"),
            ("length", "'many'", "text"),
            ("lease_token", "x'07'", "a BLOB"),
        ],
    )
    async def test_loading_writing_and_leasing_name_the_column(
        self, tmp_path: Path, column: str, value: str, kind: str
    ) -> None:
        """load_thread, write, acquire_lease and a Session all raise StoreSchemaError naming
        the thread, the column and what it holds."""
        path = tmp_path / "edited.db"
        async with SqliteStore(path) as store:
            lease = await store.acquire_lease("t", "w", 30)
            await store.write("t", ThreadWrite(["d"]), expected_version=0, lease=lease)
            await store.release_lease(lease)
            if column == "lease_token":
                await store.acquire_lease("t", "w", 30)
        _edit(path, f"UPDATE tinyctx_threads SET {column} = {value}")
        expected = rf"thread 't': tinyctx_threads\.{column} holds {kind}"
        async with SqliteStore(path) as store:
            with pytest.raises(StoreSchemaError, match=expected):
                await store.load_thread("t")
            if column != "lease_token":  # a write reads only version, length and position
                with pytest.raises(StoreSchemaError, match=expected):
                    await store.write("t", ThreadWrite(["e"]), expected_version=1)
            with pytest.raises(StoreSchemaError, match=expected):
                await store.acquire_lease("t", "other", 30)
            with pytest.raises(StoreSchemaError, match=expected):
                async with Session(Agent(model=ScriptedModel(["x"])), thread_id="t", store=store):
                    pass
