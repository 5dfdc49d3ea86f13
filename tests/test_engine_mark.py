"""The mark a durable-engine workflow leaves in its thread stops guarding the thread once
another owner has written it: that workflow's next write is refused, so it can never
finish the run, and ``recover`` and ``resume`` must not refuse the thread for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_app import work_agent
from tinyctx import AssistantMessage, SessionBusy, ToolCall, UserMessage
from tinyctx.agent import ENGINE_STATE, Session
from tinyctx.codec import decode_state, encode_messages, encode_state
from tinyctx.stores import SqliteStore
from tinyctx.threads import ThreadWrite

pytestmark = pytest.mark.anyio

WORKER = "engine-worker"


async def _marked_thread(store: SqliteStore, *, owner: str | None = WORKER) -> None:
    """A thread a workflow (leasing as ``owner``) marked, left mid-step: one call open."""
    call = ToolCall("w0", "work", {"key": "th:0"})
    mark = {"workflow_id": "wf-lost"} | ({"owner": owner} if owner else {})
    history = [UserMessage("go"), AssistantMessage("", tool_calls=(call,))]
    change = ThreadWrite(append=encode_messages(history), state=encode_state({ENGINE_STATE: mark}))
    await store.write("th", change, expected_version=0)


async def _mark(store: SqliteStore) -> object:
    record = await store.load_thread("th")
    return decode_state(record.state).get(ENGINE_STATE) if record.state else None


class TestEngineMark:
    """Another owner's write drops the mark; the marking workflow's own writes keep it."""

    async def test_another_owners_write_drops_the_mark(self, tmp_path: Path) -> None:
        """The app takes the thread over (a run closes the dead step and writes): the
        mark goes with that write, and a later session recovers and resumes freely."""
        store = SqliteStore(tmp_path / "threads.db")
        await _marked_thread(store)
        effects = tmp_path / "effects"
        async with Session(work_agent(effects), thread_id="th", store=store, owner="app") as s:
            with pytest.raises(SessionBusy, match="wf-lost"):
                await s.recover("continue")  # nothing written yet: the workflow may return
            await s.run("go on")
        assert await _mark(store) is None
        async with Session(work_agent(effects), thread_id="th", store=store, owner="app") as s:
            assert s.abandoned == ()
        await store.aclose()

    async def test_a_mark_with_no_owner_is_dropped_too(self, tmp_path: Path) -> None:
        """A mark written before marks named their owner is another owner's."""
        store = SqliteStore(tmp_path / "threads.db")
        await _marked_thread(store, owner=None)
        async with Session(work_agent(tmp_path / "e"), thread_id="th", store=store) as s:
            await s.run("go on")
        assert await _mark(store) is None
        await store.aclose()

    async def test_the_workflows_own_write_keeps_it(self, tmp_path: Path) -> None:
        """A session leasing as the marking workflow's owner writes the mark back."""
        store = SqliteStore(tmp_path / "threads.db")
        await _marked_thread(store)
        effects = tmp_path / "effects"
        async with Session(work_agent(effects), thread_id="th", store=store, owner=WORKER) as s:
            await s.run("go on")
        assert await _mark(store) == {"workflow_id": "wf-lost", "owner": WORKER}
        await store.aclose()
