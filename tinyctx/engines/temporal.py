"""A tinyctx run as a Temporal workflow (``pip install tinyctx[temporal]``).

::

    from tinyctx.engines.temporal import TemporalEngine

    engine = TemporalEngine(agent, store, name="support", task_queue="support")
    async with engine.worker(client):                  # the workflow and its activities
        result = await engine.run(client, "thread-1", "hello", request_id="req-42")

One workflow (``tinyctx.run``) per ``run``/``resume``; its id is the idempotency key (by
default from the thread and the request id). The session and every layer run inside the
workflow, in Temporal's sandbox with tinyctx, attrs, anyio, structlog and orjson passed
through; each model call (``tinyctx.model``), tool call (``tinyctx.tool:<name>``),
thread load and write (``tinyctx.store.load``, ``tinyctx.store.write``) and lease call
(``tinyctx.lease.acquire|renew|release``) is an activity with JSON inputs. A tool
activity gets a serialized context: the run's config, the agent's tools and the engine's
``data``; the layer order is in the workflow's start request (checked on replay). A
paused run waits for the ``tinyctx.decide`` signal in the same workflow (the
``tinyctx.pause`` query returns its checkpoint), or, with
``approvals="end"``, the workflow ends at the pause and ``start_resume`` continues it.
An exception of workflow code fails the workflow (``engine.result`` raises
``WorkflowFailed``), except those of :data:`TASK_RETRIED`, which fail the task. Temporal's
async API runs on asyncio, so an engine refuses trio.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

# imported here, outside the sandbox: anyio loads its asyncio backend on first use, and
# tinyctx imports some modules lazily; inside the sandbox those imports fail (its
# restricted threading, socket and os), so a fresh worker could not replay a workflow
import anyio._backends._asyncio  # noqa: F401
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RawValue, RetryPolicy
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from .. import durable as _durable  # noqa: F401 - see the anyio import above
from ..agent import Agent, Session
from ..checkpoint import Checkpoint
from ..codec import decode, decode_checkpoint, encode_checkpoint
from ..config import integer
from ..context import RunConfig
from ..decisions import Decision
from ..errors import ConfigError, ToolError
from ..messages import Message, ToolCall
from ..steps import (
    MODEL_STEP,
    TOOL_STEP_PREFIX,
    Envelope,
    clock_from,
    encode_response,
    replay_from,
    request_from_payload,
    run_ids_from,
    steps_through,
    tool_failure,
    tool_output,
    with_engine_steps,
)
from ..store_protocols import Store
from ..threads import FencedOut, LeaseHeld, ThreadStore
from ..tool_handler import run_tool_or_raise
from . import (
    STORE_LOAD_STEP,
    STORE_WRITE_STEP,
    EngineError,
    EngineResult,
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
    lease_from_json,
    lease_json,
    lease_owner,
    refuse_mixed_resume,
    refuse_trio,
    result_document,
    result_from_document,
    run_load,
    run_write,
    unmark_thread,
    workflow_id_for,
)
from ._scopes import scope_of
from ._temporal_failures import TASK_RETRIED, failure_of, workflow_failure
from ._temporal_steps import ActivityRunner, ActivityStore

__all__ = [
    "PASSTHROUGH",
    "TASK_RETRIED",
    "TemporalEngine",
    "TinyctxWorkflow",
    "failure_of",
    "sandbox_runner",
    "workflow_failure",
]

PASSTHROUGH = ("tinyctx", "attrs", "anyio", "sniffio", "structlog", "orjson", "rich")
"""Modules the workflow sandbox imports from outside (tinyctx's lazy imports, anyio's
backends and attrs' classes fail when re-imported inside it)."""

_ENGINES: dict[str, TemporalEngine] = {}


def sandbox_runner() -> SandboxedWorkflowRunner:
    """Temporal's sandbox with :data:`PASSTHROUGH` passed through."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    return SandboxedWorkflowRunner(restrictions=restrictions)


@workflow.defn(name="tinyctx.run")
class TinyctxWorkflow:
    """The workflow of one run; which engine runs it is named in its request."""

    def __init__(self) -> None:
        self.decisions: dict[str, Any] | None = None
        self.paused: str | None = None

    @workflow.run
    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        engine = _ENGINES[request["engine"]]
        return await engine._workflow(self, request)

    async def wait_for_decisions(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """Publish the pause (the query) and wait for the decide signal."""
        self.paused = encode_checkpoint(checkpoint)
        await workflow.wait_condition(lambda: self.decisions is not None)
        document, self.decisions, self.paused = self.decisions, None, None
        assert document is not None
        return document

    @workflow.signal(name="tinyctx.decide")
    def decide(self, document: dict[str, Any]) -> None:
        self.decisions = document

    @workflow.query(name="tinyctx.pause")
    def pause(self) -> str | None:
        return self.paused


class TemporalEngine:
    """Runs ``agent``'s runs on threads of ``store`` as Temporal workflows (see the module).

    ``data`` is the application data tools get (``Injected``) in their activities;
    ``activity_timeout`` bounds one model or tool call; ``attempts`` is how many times
    Temporal tries an activity (1: never retried, so a tool runs at most once per
    delivery). ``approvals``: ``"wait"`` (a paused run waits in its workflow for
    :meth:`decide`) or ``"end"`` (the workflow ends at the pause, status ``"paused"``;
    :meth:`start_resume` continues it in a new workflow); mixing them is refused.
    """

    def __init__(
        self,
        agent: Agent,
        store: ThreadStore,
        *,
        name: str = "agent",
        task_queue: str = "tinyctx",
        lease_ttl: float = 30.0,
        activity_timeout: float = 300.0,
        attempts: int = 1,
        data: Any = None,
        stores: Mapping[str, Store] | None = None,
        approvals: str = "wait",
    ) -> None:
        refuse_trio("TemporalEngine")
        self.approvals = check_approvals(approvals, "TemporalEngine")
        check_engine_target(agent, name, "TemporalEngine")
        integer(minimum=1, allowed="an int >= 1").check(attempts, "attempts", "TemporalEngine")
        self.raw_agent = agent
        self.agent = with_engine_steps(agent)
        self.store = store
        self.name = name
        self.task_queue = task_queue
        self.lease_ttl = lease_ttl
        self.activity_timeout = timedelta(seconds=activity_timeout)
        self.retry = RetryPolicy(maximum_attempts=attempts)
        self.data = data
        self.stores = dict(stores or {})
        self._layers = layer_order(self.agent)
        _ENGINES[name] = self

    # -- the caller's side ---------------------------------------------------------------

    def worker(self, client: Client, **options: Any) -> Worker:
        """A worker for this engine's task queue: the workflow, in the sandbox with
        :data:`PASSTHROUGH`, and the activities. Use it as ``async with``."""
        return Worker(
            client,
            task_queue=self.task_queue,
            workflows=[TinyctxWorkflow],
            activities=self.activities(),
            workflow_runner=sandbox_runner(),
            **options,
        )

    async def start(
        self,
        client: Client,
        thread_id: str,
        input: str | Message | Sequence[Message] | None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> str:
        """Start the run's workflow (once per id: a second start of a running or finished
        id is not started again) and return its id."""
        request = {
            "engine": self.name,
            "layers": list(self._layers),
            "kind": "run",
            "thread_id": thread_id,
            "input": input_documents(input),
        }
        return await self._start(client, request, thread_id, request_id, workflow_id)

    async def _start(
        self,
        client: Client,
        request: dict[str, Any],
        thread_id: str,
        request_id: str | None,
        workflow_id: str | None,
    ) -> str:
        from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
        from temporalio.exceptions import WorkflowAlreadyStartedError

        if workflow_id is None:
            if request_id is None:
                raise ConfigError(
                    "request_id", None, "a request id or a workflow_id", owner="TemporalEngine"
                )
            workflow_id = workflow_id_for(thread_id, request_id)
        # an id that already ran to its end (a worker restarted after it finished) stays
        # that run: the start is idempotent, as for a running one
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await client.start_workflow(
                "tinyctx.run",
                request,
                id=workflow_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        return workflow_id

    async def start_resume(
        self,
        client: Client,
        thread_id: str,
        decisions: Mapping[str, Decision] | None = None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> str:
        """Resume the thread's stored paused run (one whose workflow ended at the pause, or
        a plain session's) in a new workflow, and return its id. A pause that a workflow
        waits on (``approvals="wait"``) is refused with EngineError: :meth:`decide` it."""
        await refuse_mixed_resume(self.store, thread_id, "TemporalEngine.start_resume")
        request = {
            "engine": self.name,
            "layers": list(self._layers),
            "kind": "resume",
            "thread_id": thread_id,
            "decisions": decisions_document(decisions or {}),
        }
        return await self._start(client, request, thread_id, request_id, workflow_id)

    async def result(self, client: Client, workflow_id: str) -> EngineResult:
        """Wait for the workflow's run to end and return what it produced; a workflow
        that failed (an error in a layer, a tool, the store) raises
        :class:`~tinyctx.engines.WorkflowFailed` with the error's type and message."""
        from temporalio.client import WorkflowFailureError

        try:
            document = await client.get_workflow_handle(workflow_id).result()
        except WorkflowFailureError as failed:
            error_type, message = failure_of(failed)
            raise WorkflowFailed(workflow_id, error_type, message) from failed
        return result_from_document(document)

    async def run(
        self,
        client: Client,
        thread_id: str,
        input: str | Message | Sequence[Message] | None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ) -> EngineResult:
        started = await self.start(
            client, thread_id, input, request_id=request_id, workflow_id=workflow_id
        )
        return await self.result(client, started)

    async def pause(self, client: Client, workflow_id: str) -> Any:
        """The checkpoint the workflow is paused on now, or None."""
        document = await client.get_workflow_handle(workflow_id).query("tinyctx.pause")
        return decode_checkpoint(document) if document else None

    async def decide(
        self, client: Client, workflow_id: str, decisions: Mapping[str, Decision]
    ) -> None:
        """Signal the paused workflow its decisions; it resumes the run in place. A
        workflow that is not running any more (it ended at the pause) is refused with
        EngineError."""
        from temporalio.client import WorkflowExecutionStatus

        handle = client.get_workflow_handle(workflow_id)
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            raise ended_at_pause(workflow_id, "TemporalEngine.decide")
        await handle.signal("tinyctx.decide", decisions_document(decisions))

    # -- inside the workflow -------------------------------------------------------------

    async def activity(
        self, name: str, arg: dict[str, Any], *, activity_id: str | None = None
    ) -> Any:
        return await workflow.execute_activity(
            name,
            arg,
            activity_id=activity_id,
            start_to_close_timeout=self.activity_timeout,
            retry_policy=self.retry,
        )

    async def _workflow(self, wf: TinyctxWorkflow, request: dict[str, Any]) -> dict[str, Any]:
        """The run, its exceptions turned into the workflow's failure (see
        :func:`workflow_failure`): a failed task would be retried from a history that
        already holds the session's cleanup after the error (its writes, the lease's
        release), and a retry that goes another way is refused by Temporal as
        nondeterministic, so the run would never end."""
        try:
            return await self._run_session(wf, request)
        except Exception as exc:
            failure = workflow_failure(exc)
            if failure is exc:
                raise
            raise failure from exc

    async def _run_session(self, wf: TinyctxWorkflow, request: dict[str, Any]) -> dict[str, Any]:
        workflow_id = workflow.info().workflow_id
        # the layer order the workflow was started with is in its history (the start
        # request): a worker that stacks them differently is refused here, before any step
        check_layers(request.get("layers", self._layers), self._layers)
        runner = ActivityRunner(self, self._layers)
        owner = lease_owner(workflow_id)
        with (
            steps_through(runner),
            run_ids_from(workflow_id),
            clock_from(lambda: workflow.now().timestamp()),
            replay_from(workflow.unsafe.is_replaying),
        ):
            session: Session[Any] = Session(
                self.agent,
                thread_id=request["thread_id"],
                store=ActivityStore(self, runner),
                owner=owner,
                lease_ttl=self.lease_ttl,
                # unbounded: the activities' timeouts bound each write and lease call. A
                # finite bound is a durable timer around every write, whose cancelling
                # while Temporal evicts the workflow broke anyio's scopes and the write
                grace_period=math.inf,
                # tools run in activities; the workflow's registry checks their
                # injections against the same data and stores as the activities'
                data=self.data,
                stores=self.stores,
            )
            async with session:
                claim_thread(session, request["kind"], workflow_id, owner)
                try:
                    result = await drive(session, request, self.approvals, wf.wait_for_decisions)
                finally:
                    unmark_thread(session)  # a killed worker leaves it: the run is pending
            return result_document(workflow_id, result)

    # -- the activities (outside the sandbox) ---------------------------------------------

    def activities(self) -> list[Callable[..., Any]]:
        """The activities a worker for this engine registers: the store's, the model's and
        the agent's tools by their step names, and one dynamic activity for the steps
        named at run time (a sub-agent's calls, MCP servers' and other request-scoped
        tools)."""
        store = self.store

        @activity.defn(name=MODEL_STEP)
        async def model(arg: dict[str, Any]) -> Envelope:
            return await self._run_step(MODEL_STEP, arg)

        @activity.defn(name=STORE_LOAD_STEP)
        async def load(arg: dict[str, Any]) -> Envelope:
            return await run_load(store, arg["thread_id"])

        @activity.defn(name=STORE_WRITE_STEP)
        async def write(arg: dict[str, Any]) -> Envelope:
            return await self._write(arg)

        @activity.defn(name="tinyctx.lease.acquire")
        async def acquire(arg: dict[str, Any]) -> Any:
            return lease_json(await store.acquire_lease(arg["thread_id"], arg["owner"], arg["ttl"]))

        @activity.defn(name="tinyctx.lease.renew")
        async def renew(arg: dict[str, Any]) -> Any:
            lease = lease_from_json(arg["lease"])
            assert lease is not None
            try:
                return lease_json(await store.renew_lease(lease, arg["ttl"]))
            except FencedOut:
                # a retried write of this workflow took the thread over with a newer
                # token of the same owner while this renewal was on its way: renew that
                current = (await store.load_thread(lease.thread_id)).lease
                if current is None or current.owner != lease.owner:
                    raise
                return lease_json(await store.renew_lease(current, arg["ttl"]))

        @activity.defn(name="tinyctx.lease.reclaim")
        async def reclaim(arg: dict[str, Any]) -> Any:
            # the workflow was fenced out by its own owner (see ActivityStore.write)
            lease = lease_from_json(arg["lease"])
            assert lease is not None
            try:
                return lease_json(
                    await store.acquire_lease(lease.thread_id, lease.owner, arg["ttl"])
                )
            except LeaseHeld:
                return None  # another owner's: a real loss

        @activity.defn(name="tinyctx.lease.release")
        async def release(arg: dict[str, Any]) -> None:
            lease = lease_from_json(arg["lease"])
            assert lease is not None
            try:
                await store.renew_lease(lease, self.lease_ttl)  # is it still the current one?
            except FencedOut as exc:
                if exc.current is None:
                    return  # released already
                # a newer token, granted to an attempt the history never kept (or to
                # another owner, whose lease stays): the workflow is done with the thread
                try:
                    lease = await store.acquire_lease(lease.thread_id, lease.owner, self.lease_ttl)
                except LeaseHeld:
                    return
            await store.release_lease(lease)

        @activity.defn(dynamic=True)
        async def named_at_run_time(args: Sequence[RawValue]) -> Envelope:
            arg = activity.payload_converter().from_payload(args[0].payload, dict)
            return await self._run_step(activity.info().activity_type, arg)

        tools = [self._tool_activity(TOOL_STEP_PREFIX + t.name) for t in self.raw_agent.tools]
        return [model, load, write, acquire, renew, reclaim, release, named_at_run_time, *tools]

    async def _write(self, arg: dict[str, Any]) -> Envelope:
        """A thread write. A retry (attempt 2 or later: Temporal gave up on an earlier
        attempt, whose worker may only be stalled) takes the thread over first with a
        new lease token of the workflow's owner, so the store fences the earlier
        attempt's write out if it ever arrives; the envelope tells the workflow the new
        lease."""
        old = lease_from_json(arg["lease"])
        if old is None or activity.info().attempt == 1:
            return await run_write(self.store, arg)
        taken = await self.store.acquire_lease(old.thread_id, old.owner, self.lease_ttl)
        envelope = await run_write(self.store, {**arg, "lease": lease_json(taken)})
        # told even when the write was refused (the workflow writes with it next)
        envelope["output"]["lease"] = lease_json(taken)
        return envelope

    def _tool_activity(self, name: str) -> Callable[..., Any]:
        @activity.defn(name=name)
        async def run_tool(arg: dict[str, Any]) -> Envelope:
            return await self._run_step(name, arg)

        return run_tool

    async def _run_step(self, name: str, arg: Mapping[str, Any]) -> Envelope:
        """Run the model or tool step ``name`` in the worker, in the serialized context:
        a store-less session of the step's (sub-)agent with the run's config, the
        engine's ``data`` and ``stores``, the agent's and its MCP servers' tools."""
        scope = scope_of(self.raw_agent, name)
        config = decode(json.dumps(arg["config"]), RunConfig)
        async with scope.session(config, self.data, self.stores) as session:
            if scope.step == MODEL_STEP:
                response = await scope.agent.model(request_from_payload(arg), session.ctx)
                return {"digest": arg["digest"], "output": encode_response(response)}
            if not scope.step.startswith(TOOL_STEP_PREFIX):
                raise EngineError(f"activity {name!r} is no tinyctx step")
            call = decode(json.dumps(arg["call"]), ToolCall)
            try:
                output = tool_output(await run_tool_or_raise(call, session.ctx))
            except ToolError as exc:
                output = tool_failure(exc)
        return {"digest": arg["digest"], "output": output}
