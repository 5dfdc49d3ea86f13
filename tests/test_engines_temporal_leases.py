"""A Temporal workflow whose lease was taken over by its own owner without its history
learning it (an activity attempt killed after its takeover, before it reported) takes
the thread back and finishes, while a stalled attempt's old token stays fenced out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from tests.engine_app import TOOL_CALLS, append_line, executions, time_skipping_env, work_agent
from tinyctx import Agent, SqliteStore, tool
from tinyctx.agent import ENGINE_STATE, Session
from tinyctx.codec import decode_messages, decode_state
from tinyctx.context import RunContext
from tinyctx.engines import WorkflowFailed, lease_json, lease_owner
from tinyctx.engines.temporal import TemporalEngine
from tinyctx.messages import AssistantMessage, ToolCall, ToolResult, check_pairing
from tinyctx.model import ModelRequest, ModelResponse
from tinyctx.threads import FencedOut, ThreadWrite

env = time_skipping_env  # the Temporal test server fixture


@pytest.fixture
def anyio_backend() -> str:
    """Temporal's client and worker run on asyncio."""
    return "asyncio"


def _usurping_agent(
    effects: Path, store: SqliteStore, usurp_at: set[int], *, by: str | None = None
) -> Agent:
    """Calls ``work`` :data:`TOOL_CALLS` times; the calls numbered in ``usurp_at`` first
    take the thread's lease over: with the lease's own owner (a new token the workflow
    never hears of, as a killed write attempt's takeover does), or as the owner ``by``."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        done = sum(isinstance(m, ToolResult) for m in request.messages)
        if done < TOOL_CALLS:
            call = ToolCall(f"w{done}", "work", {"step": done, "thread": ctx.thread_id})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage(f"did {done} steps"))

    @tool
    async def work(step: int, thread: str) -> str:
        """One step of work (logs its execution)."""
        if step in usurp_at:
            held = (await store.load_thread(thread)).lease
            assert held is not None
            if by is not None:
                await store.release_lease(held)  # as if it had expired
            await store.acquire_lease(thread, by or held.owner, 30.0)
        append_line(effects, f"{thread}:{step}")
        return f"done {step}"

    return Agent(model, tools=[work], name="usurped")


class TestFencedByItsOwnOwner:
    """A workflow fenced out by a newer token of its own owner takes the thread back."""

    @pytest.mark.parametrize("usurp_at", [{2}, {0, 3, TOOL_CALLS - 1}])
    async def test_run_finishes(
        self, tmp_path: Path, env: WorkflowEnvironment, usurp_at: set[int]
    ) -> None:
        """The run completes (it used to retry its workflow task forever on the recorded
        FencedOut): every tool ran once, the thread pairs and no lease is left held."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        agent = _usurping_agent(effects, store, usurp_at)
        engine = TemporalEngine(agent, store, name="usurped", task_queue="usurped")
        async with engine.worker(env.client):
            with anyio.fail_after(60):
                result = await engine.run(env.client, "th", "go", request_id="r")
        assert (result.status, result.final_text) == ("completed", f"did {TOOL_CALLS} steps")
        assert executions(effects) == {f"th:{k}": 1 for k in range(TOOL_CALLS)}
        record = await store.load_thread("th")
        check_pairing(decode_messages(record.messages), allow_pending=False)
        assert record.lease is None
        await store.aclose()


class TestFencedByAnotherOwner:
    """A workflow whose thread another owner took has lost it: the workflow fails."""

    async def test_workflow_fails(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The run ends with WorkflowFailed naming FencedOut (it used to retry its task
        forever); the calls before ran once, none after, and the other owner keeps the
        thread."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        agent = _usurping_agent(effects, store, {2}, by="someone else")
        engine = TemporalEngine(agent, store, name="lost", task_queue="lost")
        async with engine.worker(env.client):
            workflow_id = await engine.start(env.client, "th", "go", request_id="r")
            with anyio.fail_after(60), pytest.raises(WorkflowFailed) as failed:
                await engine.result(env.client, workflow_id)
        assert failed.value.error_type == "FencedOut"
        assert executions(effects) == {"th:0": 1, "th:1": 1, "th:2": 1}
        record = await store.load_thread("th")
        assert record.lease is not None and record.lease.owner == "someone else"
        assert record.state is not None and ENGINE_STATE in decode_state(record.state)
        # the other owner's first write drops the lost workflow's mark: the thread is
        # the application's again, and nothing refuses its recover or resume
        record_lease = record.lease
        await store.release_lease(record_lease)
        async with Session(work_agent(effects), thread_id="th", store=store) as session:
            await session.run("the app goes on")
        record = await store.load_thread("th")
        assert record.state is not None and ENGINE_STATE not in decode_state(record.state)
        check_pairing(decode_messages(record.messages), allow_pending=False)
        await store.aclose()


class TestReleaseActivity:
    """The workflow's last lease call frees the thread from its own owner's newer token."""

    async def _activities(self, tmp_path: Path) -> tuple[SqliteStore, dict[str, Any]]:
        store = SqliteStore(tmp_path / "threads.db")
        agent = _usurping_agent(tmp_path / "effects", store, set())
        engine = TemporalEngine(agent, store, name="release", task_queue="release")
        named = {getattr(f, "__temporal_activity_definition").name: f for f in engine.activities()}
        return store, named

    async def test_newer_token_of_the_owner(self, tmp_path: Path) -> None:
        """Released with an older token of the same owner, the current lease goes too."""
        store, activities = await self._activities(tmp_path)
        owner = lease_owner("wf")
        old = await store.acquire_lease("th", owner, 30.0)
        await store.write("th", ThreadWrite(state='{"k": 1}'), expected_version=0, lease=old)
        await store.acquire_lease("th", owner, 30.0)  # the takeover nobody heard of
        await ActivityEnvironment().run(
            activities["tinyctx.lease.release"], {"lease": lease_json(old)}
        )
        assert (await store.load_thread("th")).lease is None
        await store.aclose()

    async def test_another_owner_keeps_its_lease(self, tmp_path: Path) -> None:
        """A live lease of another owner is left alone."""
        store, activities = await self._activities(tmp_path)
        old = await store.acquire_lease("th", lease_owner("wf"), 0.05)
        await store.write("th", ThreadWrite(state='{"k": 1}'), expected_version=0, lease=old)
        await anyio.sleep(0.1)
        other = await store.acquire_lease("th", "someone else", 30.0)
        await ActivityEnvironment().run(
            activities["tinyctx.lease.release"], {"lease": lease_json(old)}
        )
        assert (await store.load_thread("th")).lease == other
        with pytest.raises(FencedOut):
            await store.write("th", ThreadWrite(state='{"k": 2}'), expected_version=1, lease=old)
        await store.aclose()
