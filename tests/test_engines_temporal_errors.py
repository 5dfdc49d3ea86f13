"""An exception raised in workflow code (a layer, not an activity) on Temporal's
time-skipping test server ends the workflow with a failure carrying the error, after the
session's cleanup left the thread consistent; a transient error in an activity is
retried by Temporal and the run finishes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.engine_app import (
    TOOL_CALLS,
    assert_thread_free,
    executions,
    review_agent,
    temporal_pause,
    time_skipping_env,
    work_agent,
)
from tinyctx import Agent, Layer, Reject, SqliteStore, TinyCtxError, ToolCall
from tinyctx.agent import ENGINE_STATE
from tinyctx.codec import decode_messages, decode_state
from tinyctx.context import RunContext
from tinyctx.durable import ThreadWriteFailed
from tinyctx.engines import WorkflowFailed
from tinyctx.engines.temporal import (
    TemporalEngine,
    TinyctxWorkflow,
    sandbox_runner,
    workflow_failure,
)
from tinyctx.errors import RetryableProviderError
from tinyctx.messages import Message, check_pairing
from tinyctx.model import ModelRequest, ModelResponse
from tinyctx.steps import NondeterminismError
from tinyctx.testing import capture_events
from tinyctx.threads import FencedOut, LeaseHeld, StaleThreadVersion

env = time_skipping_env  # the Temporal test server fixture


@pytest.fixture
def anyio_backend() -> str:
    """Temporal's client and worker run on asyncio."""
    return "asyncio"


class LayerRefused(TinyCtxError):
    """A tinyctx error a layer raises."""


class RaiseBefore(Layer):
    """Raises ``error`` in the workflow before the tool call ``w2``: ``once`` only the
    first time in this process (a retried task would then go another way), else every
    time (deterministic: a replay raises it again)."""

    name = "raise_before"

    def __init__(self, error: Exception, *, once: bool) -> None:
        self.error = error
        self.once = once
        self.raised = 0

    async def wrap_tool(self, call: ToolCall, ctx: RunContext[Any], call_next: Any) -> Any:
        if call.id == "w2" and not (self.once and self.raised):
            self.raised += 1
            raise self.error
        return await call_next(call, ctx)


async def _consistent(store: SqliteStore, thread_id: str) -> tuple[Message, ...]:
    """The stored thread pairs, holds no live lease, no pending checkpoint and no mark
    of a workflow owning its run."""
    record = await store.load_thread(thread_id)
    messages = decode_messages(record.messages)
    check_pairing(messages, allow_pending=False)
    await assert_thread_free(store, thread_id)
    assert record.checkpoint is None
    assert record.state is not None and ENGINE_STATE not in decode_state(record.state)
    return messages


async def _history(client: Client, workflow_id: str) -> WorkflowHistory:
    return await client.get_workflow_handle(workflow_id).fetch_history()


def _kinds(history: WorkflowHistory) -> list[str]:
    return [EventType.Name(e.event_type) for e in history.events]


async def _fail(engine: TemporalEngine, client: Client) -> tuple[str, WorkflowFailed]:
    async with engine.worker(client):
        workflow_id = await engine.start(client, "th", "go", request_id="r")
        with pytest.raises(WorkflowFailed) as failed:
            await engine.result(client, workflow_id)
    return workflow_id, failed.value


class TestLayerErrorFailsTheWorkflow:
    """A layer's exception ends the workflow as failed, with its type and message."""

    async def test_error_raised_once(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The reproduction: a RuntimeError raised once fails the workflow (no task
        failure, no retry into Temporal's nondeterminism error); the thread pairs, no
        lease is held, and the calls before it ran once, the one it stopped never."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        layer = RaiseBefore(RuntimeError("layer broke"), once=True)
        agent = work_agent(effects, middleware=(layer,))
        engine = TemporalEngine(agent, store, name="err-once", task_queue="err-once")
        workflow_id, failed = await _fail(engine, env.client)
        assert (failed.error_type, failed.error) == ("RuntimeError", "layer broke")
        assert failed.workflow_id == workflow_id
        assert layer.raised == 1
        kinds = _kinds(await _history(env.client, workflow_id))
        assert kinds[-1] == "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED"
        assert "EVENT_TYPE_WORKFLOW_TASK_FAILED" not in kinds
        assert executions(effects) == {"th:0": 1, "th:1": 1}
        messages = await _consistent(store, "th")
        assert [c.id for m in messages for c in getattr(m, "tool_calls", ())] == [
            "w0",
            "w1",
            "w2",
        ]
        await store.aclose()

    async def test_tinyctx_error(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """A tinyctx error fails the workflow the same way, named by its own type."""
        store = SqliteStore(tmp_path / "threads.db")
        layer = RaiseBefore(LayerRefused("over the budget"), once=False)
        agent = work_agent(tmp_path / "effects", middleware=(layer,))
        engine = TemporalEngine(agent, store, name="err-tc", task_queue="err-tc")
        _, failed = await _fail(engine, env.client)
        assert (failed.error_type, failed.error) == ("LayerRefused", "over the budget")
        assert "LayerRefused: over the budget" in str(failed)
        await _consistent(store, "th")
        await store.aclose()

    async def test_failed_history_replays(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The failed workflow's history, cleanup included, replays without a mismatch:
        the session's exit issues the same commands in the same order on replay."""
        store = SqliteStore(tmp_path / "threads.db")
        layer = RaiseBefore(RuntimeError("always"), once=False)
        agent = work_agent(tmp_path / "effects", middleware=(layer,))
        engine = TemporalEngine(agent, store, name="err-rp", task_queue="err-rp")
        workflow_id, _ = await _fail(engine, env.client)
        history = await _history(env.client, workflow_id)
        replayer = Replayer(workflows=[TinyctxWorkflow], workflow_runner=sandbox_runner())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
        assert layer.raised == 2  # the run and its replay
        await store.aclose()

    async def test_thread_runs_again(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """After the failure the thread is the application's: the next request's
        workflow runs on it to the end."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        layer = RaiseBefore(RuntimeError("layer broke"), once=True)
        agent = work_agent(effects, middleware=(layer,))
        engine = TemporalEngine(agent, store, name="err-again", task_queue="err-again")
        await _fail(engine, env.client)
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go on", request_id="r2")
        assert result.status == "completed"
        assert result.tool_calls == TOOL_CALLS
        await _consistent(store, "th")
        await store.aclose()


def _flaky_agent(effects: Path) -> Agent:
    """:func:`work_agent`'s model, failing with a RetryableProviderError the first time
    it is called in this process."""
    inner = work_agent(effects)
    failures = [RetryableProviderError("overloaded", status=529)]

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        if failures:
            raise failures.pop()
        response: ModelResponse = await inner.model(request, ctx)
        return response

    return Agent(model, tools=inner.tools, name="flaky")


class TestTransientErrorRetries:
    """A transient error belongs to an activity: Temporal retries it, the run finishes."""

    async def test_retried_model_call(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """A model call failing once with RetryableProviderError is retried (attempts=2):
        the run completes, every tool ran once, and the thread pairs."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(
            _flaky_agent(effects), store, name="flaky", task_queue="flaky", attempts=2
        )
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go", request_id="r")
        assert result.status == "completed"
        assert set(executions(effects).values()) == {1}
        await _consistent(store, "th")
        await store.aclose()

    async def test_one_attempt_fails_the_workflow(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """With attempts=1 the same error fails the workflow, named under Temporal's
        activity wrapper; the thread stays consistent."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(
            _flaky_agent(tmp_path / "effects"), store, name="flaky1", task_queue="flaky1"
        )
        _, failed = await _fail(engine, env.client)
        assert (failed.error_type, failed.error) == ("RetryableProviderError", "overloaded")
        await _consistent(store, "th")
        await store.aclose()


class TestEvictedEveryTask:
    """A worker that keeps no workflow cached (each task evicts it and the next replays
    the history) runs and fails runs as a caching one does: the session's exit issues no
    timer, so evicting it mid-run raises nothing inside anyio and writes nothing."""

    @pytest.mark.parametrize("raises", [False, True], ids=["completes", "fails"])
    async def test_run(self, tmp_path: Path, env: WorkflowEnvironment, raises: bool) -> None:
        """Every tool runs once, no thread write is reported failed, the thread pairs;
        the run completes, or fails with the layer's error."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        layers = (RaiseBefore(RuntimeError("layer broke"), once=False),) if raises else ()
        engine = TemporalEngine(
            work_agent(effects, middleware=layers), store, name="evict", task_queue="evict"
        )
        with capture_events(ThreadWriteFailed) as write_failures:
            async with engine.worker(env.client, max_cached_workflows=0):
                workflow_id = await engine.start(env.client, "th", "go", request_id="r")
                if raises:
                    with pytest.raises(WorkflowFailed, match="RuntimeError: layer broke"):
                        await engine.result(env.client, workflow_id)
                else:
                    assert (await engine.result(env.client, workflow_id)).tool_calls == TOOL_CALLS
        assert write_failures == []
        assert set(executions(effects).values()) == {1}
        assert len(executions(effects)) == (2 if raises else TOOL_CALLS)
        history = await _history(env.client, workflow_id)
        timers = [
            e.timer_started_event_attributes.start_to_fire_timeout.seconds
            for e in history.events
            if e.HasField("timer_started_event_attributes")
        ]
        # only the lease keeper's renewal period (a third of the TTL): no write's bound
        assert set(timers) <= {int(engine.lease_ttl / 3)}
        await _consistent(store, "th")
        await store.aclose()


class TestCancelledWorkflow:
    """A workflow cancelled while it waits for decisions ends as Temporal's cancellation;
    the pause stays in the thread, unleased and unmarked, for a new workflow to resume."""

    async def test_cancel_then_start_resume(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """result() raises WorkflowFailed (CancelledError); start_resume finishes the run."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(review_agent(effects), store, name="cancel", task_queue="cancel")
        async with engine.worker(env.client):
            workflow_id = await engine.start(env.client, "th", "do it", request_id="r")
            await temporal_pause(engine, env.client, workflow_id)
            await env.client.get_workflow_handle(workflow_id).cancel()
            with pytest.raises(WorkflowFailed) as failed:
                await engine.result(env.client, workflow_id)
            assert failed.value.error_type == "CancelledError"
            record = await store.load_thread("th")
            assert record.checkpoint is not None
            await assert_thread_free(store, "th")
            decisions = {"send1": Reject("no"), "delete1": Reject("no")}
            resumed = await engine.start_resume(env.client, "th", decisions, request_id="r2")
            result = await engine.result(env.client, resumed)
        assert result.status == "completed"
        assert executions(effects) == {}
        await _consistent(store, "th")
        await store.aclose()


class TestWhichExceptionsRetryTheTask:
    """Only a replay mismatch keeps Temporal's task retry."""

    @pytest.mark.parametrize(
        "error",
        [
            NondeterminismError("tinyctx.model", 2, ("a",), "differs"),
            ApplicationError("already Temporal's", type="Mine"),
        ],
        ids=lambda e: type(e).__name__,
    )
    def test_kept(self, error: Exception) -> None:
        """These leave the workflow as themselves (a task failure, or Temporal's own)."""
        assert workflow_failure(error) is error

    @pytest.mark.parametrize(
        "error",
        [
            RuntimeError("bug"),
            LayerRefused("no"),
            KeyError("k"),
            # a replayed task would meet the same recorded refusal: the thread is lost
            FencedOut("th", 1, 2),
            LeaseHeld("th", "other", 9.0),
            StaleThreadVersion("th", 1, 2),
        ],
        ids=lambda e: type(e).__name__,
    )
    def test_failed(self, error: Exception) -> None:
        """Any other exception, the store's refusals among them, becomes a non-retryable
        failure of its type and message."""
        failure = workflow_failure(error)
        assert isinstance(failure, ApplicationError)
        assert (failure.type, failure.message, failure.non_retryable) == (
            type(error).__name__,
            str(error),
            True,
        )
