"""A tinyctx run as a DBOS workflow (``pip install tinyctx[dbos]``).

::

    from dbos import DBOS
    from tinyctx.engines.dbos import DBOSEngine, sqlite_config

    engine = DBOSEngine(agent, store, name="support")   # before DBOS.launch()
    DBOS(config=sqlite_config("support", "dbos.sqlite"))
    DBOS.launch()                                        # recovers pending runs by itself
    result = await engine.run("thread-1", "hello", request_id="req-42")

Each ``run``/``resume`` is one workflow whose id is the idempotency key (by default from
the thread and the request id: a double submit runs once). Inside it every model call,
tool call and thread load/write is a DBOS step (:mod:`tinyctx.steps`); every layer is
ordinary code DBOS runs again on recovery. The thread stays in tinyctx's store; the lease
owner is derived from the workflow id. A run that pauses for approval waits durably in
the same workflow (``DBOS.recv``) and goes on when :meth:`DBOSEngine.decide` sends the
decisions; its checkpoint is published as the workflow event ``tinyctx.pause``. With
``approvals="end"`` the workflow ends at the pause instead and ``start_resume`` continues
it in a new one.

DBOS's async API runs on asyncio: an engine refuses to be built or used on trio, with an
error saying so. Workflow inputs, outputs, steps and events are stored as DBOS's portable
JSON (never pickle).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
from dbos._error import DBOSWorkflowCancelledError, DBOSWorkflowConflictIDError
from dbos._serialization import DBOSPortableJSON, PortableWorkflowError, WorkflowSerializationFormat

from ..agent import Agent, Checkpoint, Session
from ..codec import decode_checkpoint, encode_checkpoint
from ..config import number
from ..decisions import Decision
from ..messages import Message
from ..steps import (
    Envelope,
    clock_from,
    replay_from,
    run_ids_from,
    steps_through,
    with_engine_steps,
)
from ..threads import ThreadStore
from . import (
    LAYERS_STEP,
    EngineError,
    EngineResult,
    StepStore,
    WorkflowFailed,
    check_approvals,
    check_engine_target,
    check_layers,
    claim_thread,
    decisions_document,
    drive,
    ended_at_pause,
    input_documents,
    layer_order,
    lease_owner,
    refuse_mixed_resume,
    refuse_trio,
    result_document,
    result_from_document,
    unmark_thread,
    workflow_id_for,
)

__all__ = ["DECISIONS_TOPIC", "PAUSE_EVENT", "DBOSEngine", "postgres_config", "sqlite_config"]

PAUSE_EVENT = "tinyctx.pause"
"""The workflow event holding the paused run's checkpoint (codec JSON), or None."""
DECISIONS_TOPIC = "tinyctx.decisions"
"""The message topic a paused workflow receives its decisions on."""


def sqlite_config(name: str, path: str | Path, **extra: Any) -> DBOSConfig:
    """A DBOS config on an embedded SQLite system database at ``path``, fast and without
    pickle: the file is switched to WAL journaling first (a persistent setting of the file;
    DBOS's default rollback journal makes each step 3-4x slower), and values are stored
    as portable JSON."""
    path = Path(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
    config: DBOSConfig = {
        "name": name,
        "system_database_url": f"sqlite:///{path}",
        "serializer": DBOSPortableJSON,
    }
    config.update(extra)  # type: ignore[typeddict-item]
    return config


def postgres_config(name: str, url: str, **extra: Any) -> DBOSConfig:
    """A DBOS config on a PostgreSQL system database (many machines), portable JSON."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    config: DBOSConfig = {"name": name, "system_database_url": url, "serializer": DBOSPortableJSON}
    config.update(extra)  # type: ignore[typeddict-item]
    return config


def _require_asyncio(where: str) -> None:
    refuse_trio(where)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise EngineError(f"{where} must be awaited on an asyncio event loop") from None


IDENTITY_STEP = "tinyctx.identity"
"""The first step of a run's workflow: the id its run ids derive from (its own, or for a
fork the original's)."""
CLOCK_STEP = "tinyctx.clock"
"""The step recording when the workflow first started (the times its thread keeps)."""


async def _identity_of(workflow_id: str) -> str:
    status = await DBOS.get_workflow_status_async(workflow_id)
    if status is None or not status.forked_from:
        return workflow_id
    return status.forked_from


class _Runner:
    """Steps of one workflow execution as DBOS steps."""

    def __init__(self, layers: tuple[str, ...], *, replaying: bool) -> None:
        self.layers = layers
        self._count = 0
        self.replaying = replaying
        """Whether the last step came back from DBOS's record (events are then replayed)."""

    def next_index(self) -> int:
        self._count += 1
        return self._count - 1

    async def step(
        self,
        name: str,
        digest: str,
        run: Callable[[], Coroutine[Any, Any, Envelope]],
        payload: Callable[[], dict[str, Any]],
    ) -> Envelope:
        async def live() -> Envelope:
            self.replaying = False  # DBOS runs the step: from here on the run is live
            return await run()

        self.replaying = True
        result: Envelope = await DBOS.run_step_async({"name": name}, live)
        return result

    @staticmethod
    def engine_error(exc: BaseException) -> bool:
        """DBOS's own control of the workflow (cancelled, or owned by another execution):
        it ends the workflow, never a tool's failure."""
        return isinstance(exc, (DBOSWorkflowCancelledError, DBOSWorkflowConflictIDError))


async def _result_of(handle: WorkflowHandleAsync[Any]) -> EngineResult:
    try:
        document = await handle.get_result()
    except PortableWorkflowError as exc:
        raise WorkflowFailed(handle.get_workflow_id(), exc.name, exc.message) from None
    return result_from_document(document)


class DBOSEngine:
    """Runs ``agent``'s runs on threads of ``store`` as DBOS workflows (see the module).

    Build it before ``DBOS.launch()`` (that registers the workflow ``tinyctx.run:<name>``,
    which recovery finds by name), in every process that runs or recovers its runs.
    ``wait_seconds`` bounds each wait for decisions (the wait repeats until they arrive).
    ``approvals``: ``"wait"`` (a paused run waits in its workflow for :meth:`decide`) or
    ``"end"`` (the workflow ends at the pause, status ``"paused"``; :meth:`start_resume`
    continues it in a new workflow); one thread uses one of them (mixing is refused).
    """

    def __init__(
        self,
        agent: Agent,
        store: ThreadStore,
        *,
        name: str = "agent",
        lease_ttl: float = 30.0,
        wait_seconds: float = 3600.0,
        approvals: str = "wait",
    ) -> None:
        refuse_trio("DBOSEngine")
        self.approvals = check_approvals(approvals, "DBOSEngine")
        check_engine_target(agent, name, "DBOSEngine")
        number(above=0, allowed="seconds > 0").check(wait_seconds, "wait_seconds", "DBOSEngine")
        self.agent = with_engine_steps(agent)
        self.store = store
        self.name = name
        self.lease_ttl = lease_ttl
        self.wait_seconds = wait_seconds
        self.workflow_name = f"tinyctx.run:{name}"
        self._layers = layer_order(self.agent)

        async def workflow(request: dict[str, Any]) -> dict[str, Any]:
            return await self._workflow(request)

        workflow.__qualname__ = workflow.__name__ = self.workflow_name
        self._workflow_fn = DBOS.workflow(
            name=self.workflow_name, serialization_type=WorkflowSerializationFormat.PORTABLE
        )(workflow)

    # -- the caller's side ---------------------------------------------------------------

    async def start(
        self,
        thread_id: str,
        input: str | Message | Sequence[Message] | None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> str:
        """Start the run's workflow (once per id) and return its id; ``workflow_id``
        defaults to :func:`~tinyctx.engines.workflow_id_for` ``(thread_id, request_id)``."""
        request = {"kind": "run", "thread_id": thread_id, "input": input_documents(input)}
        handle = await self._start(request, thread_id, request_id, workflow_id)
        return handle.get_workflow_id()

    async def start_resume(
        self,
        thread_id: str,
        decisions: Mapping[str, Decision] | None = None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> str:
        """Resume the thread's stored paused run (one that ended its workflow at the pause)
        in a new workflow. A pause that a workflow waits on (``approvals="wait"``) is
        refused with EngineError: send it :meth:`decide` instead."""
        _require_asyncio("DBOSEngine.start_resume")
        await refuse_mixed_resume(self.store, thread_id, "DBOSEngine.start_resume")
        request = {
            "kind": "resume",
            "thread_id": thread_id,
            "decisions": decisions_document(decisions or {}),
        }
        handle = await self._start(request, thread_id, request_id, workflow_id)
        return handle.get_workflow_id()

    async def _start(
        self,
        request: dict[str, Any],
        thread_id: str,
        request_id: str | None,
        workflow_id: str | None,
    ) -> WorkflowHandleAsync[dict[str, Any]]:
        _require_asyncio("DBOSEngine.start")
        if workflow_id is None:
            if request_id is None:
                raise EngineError(
                    "DBOSEngine: pass request_id (the idempotency key of this request on the "
                    "thread) or workflow_id"
                )
            workflow_id = workflow_id_for(thread_id, request_id)
        with SetWorkflowID(workflow_id):
            handle: WorkflowHandleAsync[dict[str, Any]] = await DBOS.start_workflow_async(
                self._workflow_fn, request
            )
        return handle

    async def result(self, workflow_id: str) -> EngineResult:
        """Wait for the workflow to end and return what its run produced; an error it ended
        with is :class:`~tinyctx.engines.WorkflowFailed`."""
        _require_asyncio("DBOSEngine.result")
        handle: WorkflowHandleAsync[Any] = await DBOS.retrieve_workflow_async(workflow_id)
        return await _result_of(handle)

    async def run(
        self,
        thread_id: str,
        input: str | Message | Sequence[Message] | None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> EngineResult:
        """:meth:`start` and :meth:`result` (a workflow started here is awaited directly,
        not polled for)."""
        _require_asyncio("DBOSEngine.run")
        request = {"kind": "run", "thread_id": thread_id, "input": input_documents(input)}
        handle = await self._start(request, thread_id, request_id, workflow_id)
        return await _result_of(handle)

    async def pause(self, workflow_id: str, *, wait_seconds: float = 60.0) -> Any:
        """The checkpoint the workflow is paused on (waiting up to ``wait_seconds`` for
        it to pause), or None."""
        _require_asyncio("DBOSEngine.pause")
        document = await DBOS.get_event_async(
            workflow_id, PAUSE_EVENT, timeout_seconds=wait_seconds
        )
        return decode_checkpoint(document) if document else None

    async def decide(self, workflow_id: str, decisions: Mapping[str, Decision]) -> None:
        """Send the paused workflow its decisions (``{call_id: Approve() | Edit(...) |
        Reject(...) | Respond(...)}``); it resumes the run in the same workflow. A workflow
        that is not waiting any more (it ended at the pause) is refused with EngineError."""
        _require_asyncio("DBOSEngine.decide")
        status = await DBOS.get_workflow_status_async(workflow_id)
        if status is None or status.status not in ("PENDING", "ENQUEUED"):
            raise ended_at_pause(workflow_id, "DBOSEngine.decide")
        await DBOS.send_async(workflow_id, decisions_document(decisions), topic=DECISIONS_TOPIC)

    # -- the workflow --------------------------------------------------------------------

    async def _workflow(self, request: dict[str, Any]) -> dict[str, Any]:
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None
        # a fork (DBOS.fork_workflow) replays its original's steps: ids made in the run and
        # the thread's owner mark come from the original's id, so the replay matches
        identity: str = await DBOS.run_step_async(
            {"name": IDENTITY_STEP}, _identity_of, workflow_id
        )
        # the times the thread keeps (usage records) are the workflow's first start, as
        # recorded: a replay writes what the first execution wrote
        started: float = await DBOS.run_step_async({"name": CLOCK_STEP}, time.time)
        first_run: list[bool] = []

        def layers() -> list[str]:
            first_run.append(True)
            return list(self._layers)

        recorded: list[str] = await DBOS.run_step_async({"name": LAYERS_STEP}, layers)
        check_layers(recorded, self._layers)
        runner = _Runner(self._layers, replaying=not first_run)
        # a fork leases the thread as its original did: its replayed writes (the owner
        # mark among them) are the original's
        owner = lease_owner(identity)
        with (
            steps_through(runner),
            run_ids_from(identity),
            clock_from(lambda: started),
            replay_from(lambda: runner.replaying),
        ):
            session: Session[Any] = Session(
                self.agent,
                thread_id=request["thread_id"],
                store=StepStore(self.store, runner),
                owner=owner,
                lease_ttl=self.lease_ttl,
            )
            async with session:
                claim_thread(session, request["kind"], identity, owner)
                try:
                    result = await drive(session, request, self.approvals, self._wait)
                finally:
                    unmark_thread(session)  # a killed process leaves it: the run is pending
            return result_document(workflow_id, result)

    async def _wait(self, checkpoint: Checkpoint) -> Mapping[str, Any]:
        """Publish the pause and wait durably for its decisions."""
        await DBOS.set_event_async(PAUSE_EVENT, encode_checkpoint(checkpoint))
        document = None
        while document is None:
            document = await DBOS.recv_async(DECISIONS_TOPIC, timeout_seconds=self.wait_seconds)
        await DBOS.set_event_async(PAUSE_EVENT, None)
        return dict(document)
