"""tinyctx runs as DBOS workflows, in process: SQLite and PostgreSQL system databases,
idempotent submits, steps and their recorded outputs, durable approvals, the determinism
guard, and the refusal of trio. The crash tests with real processes are in
``test_engines_dbos_crash.py``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from dbos import DBOS, DBOSConfig

from tests.engine_app import (
    TOOL_CALLS,
    ClockInPrompt,
    executions,
    pause_outside_an_engine,
    review_agent,
    work_agent,
)
from tinyctx import (
    AssistantMessage,
    ConfigError,
    Edit,
    Reject,
    Session,
    SessionBusy,
    SqliteStore,
    ToolCall,
    UserMessage,
)
from tinyctx.agent import ENGINE_STATE
from tinyctx.codec import decode_messages, decode_state, encode_messages, encode_state
from tinyctx.decisions import Decision
from tinyctx.engines import EngineError, WorkflowFailed, lease_owner, workflow_id_for
from tinyctx.engines.dbos import DBOSEngine, postgres_config, sqlite_config
from tinyctx.messages import check_pairing
from tinyctx.steps import MODEL_STEP, TOOL_STEP_PREFIX
from tinyctx.stores import MemoryStore
from tinyctx.threads import ThreadWrite


@pytest.fixture
def anyio_backend() -> str:
    """DBOS's async API runs on asyncio (trio is refused: TestTrio)."""
    return "asyncio"


@pytest.fixture
def launch() -> Iterator[Callable[[DBOSConfig], None]]:
    """Launch DBOS with a config (after the test built its engines); destroyed after."""

    def start(config: DBOSConfig) -> None:
        DBOS(config=config)
        DBOS.launch()

    yield start
    DBOS.destroy(destroy_registry=True)


async def _stored(store: SqliteStore, thread_id: str) -> Any:
    record = await store.load_thread(thread_id)
    return record, decode_messages(record.messages)


def _no_live_lease(record: Any) -> bool:
    return record.lease is None or record.lease.expires_at <= time.time()


class TestRunOnSqlite:
    """A run is one workflow on DBOS's embedded SQLite system database."""

    async def test_run_completes_and_thread_is_in_the_store(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """The workflow's result matches the stored thread, which pairs, with no lease."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(work_agent(effects), store, name="t1")
        launch(sqlite_config("app-t1", tmp_path / "dbos.sqlite"))
        result = await engine.run("th", "go", request_id="req-1")
        assert result.status == "completed"
        assert result.tool_calls == TOOL_CALLS
        record, messages = await _stored(store, "th")
        check_pairing(messages, allow_pending=False)
        assert messages[-1].content == result.final_text
        assert _no_live_lease(record)
        assert executions(effects) == {f"th:{k}": 1 for k in range(TOOL_CALLS)}
        await store.aclose()

    async def test_double_submit_runs_once(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """Submitting the same thread and request id twice runs the tools once."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(work_agent(effects), store, name="t2")
        launch(sqlite_config("app-t2", tmp_path / "dbos.sqlite"))
        first = await engine.start("th", "go", request_id="same")
        second = await engine.start("th", "go", request_id="same")
        assert first == second == workflow_id_for("th", "same")
        a, b = await engine.result(first), await engine.result(second)
        assert a == b
        assert set(executions(effects).values()) == {1}
        _, messages = await _stored(store, "th")
        assert sum(m.role == "user" for m in messages) == 1
        await store.aclose()

    async def test_steps_have_stable_names(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """Model and tool calls are the steps tinyctx.model and tinyctx.tool:<name>."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(work_agent(tmp_path / "effects"), store, name="t3")
        launch(sqlite_config("app-t3", tmp_path / "dbos.sqlite"))
        result = await engine.run("th", "go", request_id="r")
        steps = await DBOS.list_workflow_steps_async(result.workflow_id)
        names = [s["function_name"] for s in steps]
        assert names.count(MODEL_STEP) == TOOL_CALLS + 1
        assert names.count(TOOL_STEP_PREFIX + "work") == TOOL_CALLS
        assert names[:4] == [
            "tinyctx.identity",
            "tinyctx.clock",
            "tinyctx.layers",
            "tinyctx.store.load",
        ]
        assert "tinyctx.store.write" in names
        await store.aclose()

    async def test_run_ids_are_deterministic(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """A run's id comes from its workflow id, not from randomness."""
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(work_agent(tmp_path / "effects"), store, name="t4")
        launch(sqlite_config("app-t4", tmp_path / "dbos.sqlite"))
        a = await engine.run("a", "go", workflow_id="wf-same-shape-a")
        import hashlib

        seeds = [hashlib.sha256(f"wf-same-shape-a:{n}".encode()).hexdigest()[:32] for n in range(4)]
        assert a.run_id in seeds
        await store.aclose()

    def test_lease_owner_comes_from_the_workflow(self) -> None:
        """Every execution of one workflow leases the thread as the same owner."""
        assert lease_owner("wf-1") == lease_owner("wf-1") != lease_owner("wf-2")

    def test_request_id_is_required(self, tmp_path: Path) -> None:
        """A default workflow id needs a non-empty request id, named in the error."""
        with pytest.raises(EngineError, match="request_id"):
            workflow_id_for("th", "")


class TestApprovals:
    """A paused run waits in its workflow and resumes there with the decisions."""

    async def test_edit_and_reject(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """An edited call runs with the new arguments; a rejected one never runs."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(review_agent(effects), store, name="ap")
        launch(sqlite_config("app-ap", tmp_path / "dbos.sqlite"))
        workflow_id = await engine.start("th", "do it", request_id="r")
        checkpoint = await engine.pause(workflow_id)
        assert [c.id for c in checkpoint.pending] == ["send1", "delete1"]
        record, _ = await _stored(store, "th")
        assert record.checkpoint is not None  # the pause is in the thread store too
        assert ENGINE_STATE in decode_state(record.state)  # the workflow owns the run
        await engine.decide(workflow_id, {"send1": Edit({"to": "bob"}), "delete1": Reject("no")})
        result = await engine.result(workflow_id)
        assert executions(effects) == {"send:bob": 1}
        assert "sent to bob" in result.final_text
        assert "reject" in result.final_text.lower()
        record, messages = await _stored(store, "th")
        check_pairing(messages, allow_pending=False)
        assert record.checkpoint is None
        assert _no_live_lease(record)
        assert ENGINE_STATE not in decode_state(record.state)
        await store.aclose()


class TestApprovalModes:
    """approvals="end" ends the workflow at the pause and start_resume continues it; the
    two approval modes are never mixed on one thread."""

    async def test_end_then_start_resume(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """The workflow ends paused; decide() on it is refused; start_resume finishes it."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(review_agent(effects), store, name="end", approvals="end")
        launch(sqlite_config("app-end", tmp_path / "dbos.sqlite"))
        paused = await engine.run("th", "do it", request_id="r")
        assert paused.status == "paused"
        assert paused.checkpoint is not None
        assert [c.id for c in paused.checkpoint.pending] == ["send1", "delete1"]
        record, _ = await _stored(store, "th")
        assert record.checkpoint is not None
        assert ENGINE_STATE not in decode_state(record.state)  # the thread is the app's
        decisions = {"send1": Edit({"to": "bob"}), "delete1": Reject("no")}
        with pytest.raises(EngineError, match="start_resume"):
            await engine.decide(paused.workflow_id, decisions)
        resumed = await engine.start_resume("th", decisions, request_id="r2")
        result = await engine.result(resumed)
        assert result.status == "completed"
        assert result.run_id == paused.run_id
        assert executions(effects) == {"send:bob": 1}
        record, messages = await _stored(store, "th")
        check_pairing(messages, allow_pending=False)
        assert record.checkpoint is None
        await store.aclose()

    async def test_start_resume_of_a_plain_pause(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """A run suspended by a plain tinyctx session resumes as a workflow."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        checkpoint = await pause_outside_an_engine(store, "th", effects)
        engine = DBOSEngine(review_agent(effects), store, name="plain")
        launch(sqlite_config("app-plain", tmp_path / "dbos.sqlite"))
        decisions: dict[str, Decision] = {"send1": Edit({"to": "eve"}), "delete1": Reject("no")}
        result = await engine.result(await engine.start_resume("th", decisions, request_id="x"))
        assert result.run_id == checkpoint.run_config.run_id
        assert executions(effects) == {"send:eve": 1}
        await store.aclose()

    async def test_waiting_pause_refuses_other_resumes(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """A pause a workflow waits on is resumed only by decide(): start_resume and a
        plain session's resume or run are refused, naming the workflow."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(review_agent(effects), store, name="mix")
        launch(sqlite_config("app-mix", tmp_path / "dbos.sqlite"))
        waiting = await engine.start("th", "do it", request_id="r")
        await engine.pause(waiting)
        with pytest.raises(EngineError, match="decide") as refused:
            await engine.start_resume("th", {}, request_id="r2")
        assert waiting in str(refused.value)
        unleased = await _copy_without_lease(store, "th")
        async with Session(review_agent(effects), thread_id="th", store=unleased) as session:
            assert session.paused is not None
            with pytest.raises(SessionBusy, match=waiting):
                await session.resume(decisions={"send1": Reject("no"), "delete1": Reject("no")})
            with pytest.raises(SessionBusy, match="approval modes"):
                await session.run("something else")
        await engine.decide(waiting, {"send1": Reject("no"), "delete1": Reject("no")})
        assert (await engine.result(waiting)).status == "completed"
        assert executions(effects) == {}
        await store.aclose()

    def test_unknown_mode_is_a_config_error(self, tmp_path: Path) -> None:
        """approvals other than "wait" or "end" is refused at construction, naming both."""
        store = SqliteStore(tmp_path / "threads.db")
        with pytest.raises(ConfigError, match="approvals") as refused:
            DBOSEngine(work_agent(tmp_path / "e"), store, name="bad", approvals="later")
        assert "'wait'" in str(refused.value) and "'end'" in str(refused.value)


async def _copy_without_lease(store: SqliteStore, thread_id: str) -> MemoryStore:
    """The stored thread as a worker killed while its run waited leaves it once its lease
    expired: the same messages, checkpoint and state, no live lease."""
    record = await store.load_thread(thread_id)
    copy = MemoryStore()
    assert record.state is not None  # the engine's mark is in it
    change = ThreadWrite(append=record.messages, checkpoint=record.checkpoint, state=record.state)
    await copy.write(thread_id, change, expected_version=0)
    return copy


class TestDeterminismGuard:
    """A replayed step whose request differs is refused, naming the step and the layers."""

    async def test_clock_in_the_prompt_fails_on_replay(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """Forking the workflow replays its first model step with a new clock: refused."""
        store = SqliteStore(tmp_path / "threads.db")
        agent = work_agent(tmp_path / "effects", middleware=(ClockInPrompt(),))
        engine = DBOSEngine(agent, store, name="dg")
        launch(sqlite_config("app-dg", tmp_path / "dbos.sqlite"))
        result = await engine.run("th", "go", request_id="r")
        steps = await DBOS.list_workflow_steps_async(result.workflow_id)
        first_model = next(s["function_id"] for s in steps if s["function_name"] == MODEL_STEP)
        forked = await DBOS.fork_workflow_async(result.workflow_id, first_model + 1)
        with pytest.raises(WorkflowFailed) as failed:
            await engine.result(forked.get_workflow_id())
        assert failed.value.error_type == "NondeterminismError"
        assert MODEL_STEP in failed.value.error
        assert "clock_in_prompt -> tinyctx.engine_steps" in failed.value.error
        await store.aclose()


class TestRunOnPostgres:
    """The same run on a PostgreSQL system database (a fresh schema per test)."""

    async def test_run_completes(
        self,
        tmp_path: Path,
        postgres_url: str,
        postgres_schema: str,
        launch: Callable[[DBOSConfig], None],
    ) -> None:
        """A run completes with each tool run once, the thread paired in the store."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        engine = DBOSEngine(work_agent(effects), store, name="pg")
        launch(postgres_config("app-pg", postgres_url, dbos_system_schema=postgres_schema))
        result = await engine.run("th", "go", request_id="r")
        assert result.tool_calls == TOOL_CALLS
        assert set(executions(effects).values()) == {1}
        _, messages = await _stored(store, "th")
        check_pairing(messages, allow_pending=False)
        await store.aclose()


class TestRecoverRefused:
    """tinyctx's own recover() refuses a thread whose run a workflow owns."""

    async def test_recover_refuses_an_engine_thread(self, tmp_path: Path) -> None:
        """A thread left mid-step by a killed workflow is the engine's to finish."""
        effects = tmp_path / "effects"
        store = SqliteStore(tmp_path / "threads.db")
        call = ToolCall("w0", "work", {"key": "th:0"})
        history = [UserMessage("go"), AssistantMessage("", tool_calls=(call,))]
        change = ThreadWrite(
            append=encode_messages(history),
            state=encode_state({ENGINE_STATE: {"workflow_id": "wf-dead"}}),
        )
        await store.write("th", change, expected_version=0)
        async with Session(work_agent(effects), thread_id="th", store=store) as session:
            assert [c.id for c in session.abandoned] == ["w0"]
            with pytest.raises(SessionBusy, match="wf-dead"):
                await session.recover("continue")
        assert executions(effects) == {}
        await store.aclose()


class TestTrio:
    """DBOS runs on asyncio: an engine built or used on trio is refused, saying so."""

    def test_construction_on_trio_is_refused(self, tmp_path: Path) -> None:
        """Building a DBOSEngine inside trio raises EngineError naming asyncio."""

        async def build() -> None:
            store = SqliteStore(tmp_path / "threads.db")
            try:
                DBOSEngine(work_agent(tmp_path / "effects"), store, name="trio")
            finally:
                await store.aclose()

        with pytest.raises(EngineError, match="asyncio"):
            trio.run(build)
