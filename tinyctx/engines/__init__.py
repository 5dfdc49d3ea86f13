"""tinyctx runs on durable-execution engines: :mod:`tinyctx.engines.dbos` and
:mod:`tinyctx.engines.temporal` (optional extras ``tinyctx[dbos]``, ``tinyctx[temporal]``).

What the engines share lives here: the thread store seen through steps
(:class:`StepStore`), the idempotency key of a run (:func:`workflow_id_for`), the lease
owner a workflow uses (:func:`lease_owner`), and what a finished workflow hands back
(:class:`EngineResult`). The steps themselves are :mod:`tinyctx.steps`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from attrs import field, frozen

from ..agent import ENGINE_STATE, Agent, Checkpoint, Session
from ..codec import (
    decode_checkpoint,
    decode_messages,
    decode_state,
    encode_checkpoint,
    encode_messages,
)
from ..config import implements, one_of, text
from ..decisions import Decision, decisions_from_json
from ..errors import Interrupted, TinyCtxError
from ..messages import Message, UserMessage
from ..steps import Envelope, NondeterminismError, StepRunner
from ..threads import (
    UNCHANGED,
    ArchivedRange,
    FencedOut,
    Lease,
    StaleThreadVersion,
    ThreadRecord,
    ThreadStore,
    ThreadWrite,
)

__all__ = [
    "APPROVAL_MODES",
    "LAYERS_STEP",
    "STORE_LOAD_STEP",
    "STORE_WRITE_STEP",
    "EngineError",
    "EngineResult",
    "StepStore",
    "WorkflowFailed",
    "decisions_document",
    "decisions_from_document",
    "check_layers",
    "claim_thread",
    "drive",
    "input_documents",
    "layer_order",
    "lease_owner",
    "mark_thread",
    "unmark_thread",
    "result_from_document",
    "workflow_id_for",
]

STORE_LOAD_STEP = "tinyctx.store.load"
"""The step that loads the thread when a workflow's session opens (stable)."""
STORE_WRITE_STEP = "tinyctx.store.write"
"""The step of one write to the thread (stable)."""
LAYERS_STEP = "tinyctx.layers"
"""The step recording the agent's layer order when the workflow first ran (stable)."""

APPROVAL_MODES = ("wait", "end")
"""How a workflow handles a pause: ``"wait"`` durably in the workflow for the engine's
``decide``; ``"end"``: the workflow ends at the pause (its checkpoint in the thread
store) and ``start_resume`` (or a plain ``Session.resume``) continues it."""


class EngineError(TinyCtxError):
    """An engine integration was used in a way it cannot work (named in the message)."""


class WorkflowFailed(EngineError):
    """The workflow of a run ended with an error: ``error_type`` and ``error`` say which."""

    def __init__(self, workflow_id: str, error_type: str, error: str) -> None:
        self.workflow_id = workflow_id
        self.error_type = error_type
        self.error = error
        super().__init__(f"workflow {workflow_id!r} failed: {error_type}: {error}")


def refuse_trio(where: str) -> None:
    """Raise EngineError when called on trio: DBOS's and Temporal's async APIs are asyncio."""
    try:
        import trio

        trio.lowlevel.current_task()
    except (ImportError, RuntimeError):
        return
    raise EngineError(
        f"{where}: the engine's async API runs on asyncio, and this is trio; run the engine "
        "on an asyncio event loop (anyio.run(main, backend='asyncio')), with layers and "
        "tools written on anyio: the engine runs them on its own asyncio loop when it "
        "recovers a run (docs/durable-engines.md, 'trio')"
    )


def workflow_id_for(thread_id: str, request_id: str, *, prefix: str = "tinyctx") -> str:
    """The default workflow id of a request on a thread: the same pair gives the same id,
    so a request submitted twice (a retried HTTP call) runs once."""
    for name, value in (("thread_id", thread_id), ("request_id", request_id)):
        if not isinstance(value, str) or not value:
            raise EngineError(f"{name} must be a non-empty str, got {value!r}")
    key = hashlib.sha256(f"{thread_id}\x00{request_id}".encode()).hexdigest()[:24]
    return f"{prefix}:{key}"


def lease_owner(workflow_id: str) -> str:
    """The lease owner of a workflow: every execution of it (a recovery too) is the same
    owner, so it takes over its own dead lease at once, while the store's fencing token
    still refuses a write from a stalled earlier execution."""
    return f"workflow:{workflow_id}"


def layer_order(agent: Any) -> tuple[str, ...]:
    """The agent's layer names, outermost first (what a NondeterminismError names)."""
    return tuple(getattr(m, "name", "") or repr(m) for m in agent.middleware)


def check_layers(recorded: Sequence[str], current: tuple[str, ...]) -> None:
    """Refuse a replay whose agent stacks its layers differently from the first execution:
    every step after this point would be matched to the old stack's calls."""
    if tuple(recorded) != current:
        raise NondeterminismError(
            LAYERS_STEP,
            0,
            current,
            "the layer order changed since the workflow first ran; it was: "
            + (" -> ".join(recorded) or "(no layers)"),
        )


def check_approvals(value: Any, owner: str) -> str:
    """``approvals`` validated: one of :data:`APPROVAL_MODES`."""
    checked: str = one_of(APPROVAL_MODES).check(value, "approvals", owner)
    return checked


def check_engine_target(agent: object, name: object, owner: str) -> None:
    """An engine's ``agent`` (a tinyctx Agent) and ``name`` (its workflows' non-empty
    name) validated, naming ``owner`` in the ConfigError."""
    implements(Agent, allowed="a tinyctx Agent").check(agent, "agent", owner)
    text(allowed="a non-empty str").check(name, "name", owner)


def _waiting_workflow(record: ThreadRecord) -> str | None:
    """The workflow a stored paused run waits in (approvals="wait"), or None."""
    if record.checkpoint is None or record.state is None:
        return None
    mark = decode_state(record.state).get(ENGINE_STATE)
    return str(mark["workflow_id"]) if isinstance(mark, Mapping) else None


async def refuse_mixed_resume(store: ThreadStore, thread_id: str, where: str) -> None:
    """EngineError when the thread's paused run waits inside a workflow: its decisions go
    to that workflow (``decide``), not to a resume in a new one."""
    workflow_id = _waiting_workflow(await store.load_thread(thread_id))
    if workflow_id is not None:
        raise EngineError(
            f"{where}: thread {thread_id!r} is paused inside the durable workflow "
            f"{workflow_id!r}, which waits for its decisions (approvals='wait'); send them "
            f"with decide({workflow_id!r}, ...). Resuming it in a new workflow would mix "
            "the two approval modes on one thread"
        )


def ended_at_pause(workflow_id: str, where: str) -> EngineError:
    """The error of ``decide`` sent to a workflow that is no longer waiting."""
    return EngineError(
        f"{where}: workflow {workflow_id!r} is not waiting for decisions (it ended: with "
        "approvals='end' a run's workflow ends at the pause); resume the thread with "
        "start_resume(thread_id, decisions) instead of mixing the two approval modes"
    )


# ---------------------------------------------------------------------------------------
# what crosses the workflow boundary (plain JSON)


def input_documents(input: str | Message | Sequence[Message] | None) -> list[str]:
    """A run's input as codec documents (a workflow's arguments are JSON)."""
    if input is None:
        return []
    if isinstance(input, str):
        input = (UserMessage(input),)
    elif isinstance(input, Message):
        input = (input,)
    return list(encode_messages(tuple(input), path="input"))


def decisions_document(decisions: Mapping[str, Decision]) -> dict[str, Any]:
    """``{call_id: decision JSON}``; a value that is not a decision is a TypeError."""
    out: dict[str, Any] = {}
    for call_id, decision in decisions.items():
        to_json = getattr(decision, "to_json", None)
        if not isinstance(call_id, str) or to_json is None:
            raise TypeError(
                f"decisions[{call_id!r}] must map a call id to Approve, Edit, Reject or Respond"
            )
        out[call_id] = to_json()
    return out


def decisions_from_document(document: Mapping[str, Any] | None) -> dict[str, Decision]:
    return decisions_from_json(document) if document else {}


@frozen
class EngineResult:
    """What a run's workflow handed back (a :class:`~tinyctx.RunResult` without events)."""

    workflow_id: str
    status: Literal["completed", "stopped", "paused"]
    final_text: str
    run_id: str
    thread_id: str
    model_calls: int
    tool_calls: int
    messages: tuple[Message, ...] = field(repr=False)
    checkpoint: Checkpoint | None = field(default=None, repr=False)
    """The pause a workflow with ``approvals="end"`` ended at (status ``"paused"``)."""


def result_document(workflow_id: str, result: Any) -> dict[str, Any]:
    if isinstance(result, Interrupted):
        checkpoint = result.checkpoint
        return {
            "workflow_id": workflow_id,
            "status": "paused",
            "final_text": "",
            "run_id": checkpoint.run_config.run_id,
            "thread_id": checkpoint.run_config.thread_id,
            "model_calls": checkpoint.model_calls,
            "tool_calls": checkpoint.tool_calls,
            "messages": list(encode_messages(checkpoint.added, path="result.messages")),
            "checkpoint": encode_checkpoint(checkpoint),
        }
    return {
        "workflow_id": workflow_id,
        "status": result.status,
        "final_text": result.final_text,
        "run_id": result.run_id,
        "thread_id": result.thread_id,
        "model_calls": result.model_calls,
        "tool_calls": result.tool_calls,
        "messages": list(encode_messages(result.messages, path="result.messages")),
    }


def result_from_document(document: Mapping[str, Any]) -> EngineResult:
    fields = dict(document)
    fields["messages"] = decode_messages(fields["messages"], path="result.messages")
    if fields.get("checkpoint") is not None:
        fields["checkpoint"] = decode_checkpoint(fields["checkpoint"])
    return EngineResult(**fields)


# ---------------------------------------------------------------------------------------
# the store through steps


def _record_document(record: ThreadRecord) -> dict[str, Any]:
    return {
        "thread_id": record.thread_id,
        "version": record.version,
        "messages": list(record.messages),
        "checkpoint": record.checkpoint,
        "state": record.state,
    }


def _write_digest(thread_id: str, change: ThreadWrite, expected: int) -> str:
    digest = hashlib.sha256(f"{thread_id}\x00{expected}".encode())
    for document in change.append:
        digest.update(document.encode())
    if change.compaction is not None:
        c = change.compaction
        digest.update(f"compaction {c.start} {c.end}".encode())
        for document in c.replacement:
            digest.update(document.encode())
    for part in (change.checkpoint, change.state):
        digest.update(b"-" if part is UNCHANGED else b"n" if part is None else str(part).encode())
    return digest.hexdigest()


def _raise_recorded(error: Mapping[str, Any]) -> None:
    kind = error["type"]
    if kind == "StaleThreadVersion":
        raise StaleThreadVersion(error["thread_id"], error["expected"], error["actual"])
    if kind == "FencedOut":
        raise FencedOut(error["thread_id"], error["token"], error["current"])
    raise EngineError(f"step {STORE_WRITE_STEP} failed: {kind}: {error['message']}")


def _error_document(exc: Exception) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, StaleThreadVersion):
        out.update(thread_id=exc.thread_id, expected=exc.expected, actual=exc.actual)
    elif isinstance(exc, FencedOut):
        out.update(thread_id=exc.thread_id, token=exc.token, current=exc.current)
    return out


def lease_json(lease: Lease | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {
        "thread_id": lease.thread_id,
        "owner": lease.owner,
        "token": lease.token,
        "expires_at": lease.expires_at,
    }


def lease_from_json(data: Mapping[str, Any] | None) -> Lease | None:
    return None if data is None else Lease(**data)


def write_payload(
    thread_id: str, change: ThreadWrite, expected_version: int, lease: Lease | None
) -> dict[str, Any]:
    """A thread write as JSON (for an engine that writes in an activity)."""
    compaction = change.compaction
    return {
        "thread_id": thread_id,
        "append": list(change.append),
        "compaction": None
        if compaction is None
        else [compaction.start, compaction.end, list(compaction.replacement)],
        "checkpoint": {"unchanged": True}
        if change.checkpoint is UNCHANGED
        else {"value": change.checkpoint},
        "state": {"unchanged": True} if change.state is UNCHANGED else {"value": change.state},
        "expected_version": expected_version,
        "lease": lease_json(lease),
        "run_id": change.run_id,
    }


def write_from_payload(payload: Mapping[str, Any]) -> ThreadWrite:
    from ..threads import Compaction

    compaction = payload["compaction"]
    checkpoint, state = payload["checkpoint"], payload["state"]
    return ThreadWrite(
        append=tuple(payload["append"]),
        compaction=None if compaction is None else Compaction(*compaction),
        checkpoint=UNCHANGED if "unchanged" in checkpoint else checkpoint["value"],
        state=UNCHANGED if "unchanged" in state else state["value"],
        run_id=payload.get("run_id"),  # absent from payloads recorded before
    )


async def run_write(store: ThreadStore, payload: Mapping[str, Any]) -> Envelope:
    """Apply a write payload to ``store``: the envelope a write step records."""
    thread_id = payload["thread_id"]
    change = write_from_payload(payload)
    expected = payload["expected_version"]
    digest = _write_digest(thread_id, change, expected)
    try:
        version = await store.write(
            thread_id, change, expected_version=expected, lease=lease_from_json(payload["lease"])
        )
    except (StaleThreadVersion, FencedOut) as exc:
        return {"digest": digest, "output": {"error": _error_document(exc)}}
    return {"digest": digest, "output": {"version": version}}


async def run_load(store: ThreadStore, thread_id: str) -> Envelope:
    record = await store.load_thread(thread_id)
    return {"digest": thread_id, "output": _record_document(record)}


class _EngineMark:
    """The thread state saying which workflow owns the thread's run."""

    def __init__(self, workflow_id: str, owner: str) -> None:
        self.workflow_id = workflow_id
        self.owner = owner

    def to_json(self) -> dict[str, str]:
        return {"workflow_id": self.workflow_id, "owner": self.owner}

    @classmethod
    def from_json(cls, data: Any) -> _EngineMark:
        return cls(str(data["workflow_id"]), str(data.get("owner", "")))


def mark_thread(session: Session[Any], workflow_id: str, owner: str) -> None:
    """Record in the thread (written with its next write) that ``workflow_id`` owns its
    run, leasing it as ``owner``: ``Session.recover`` and any other session's resume of
    its pause then refuse the thread, as the engine finishes the run."""
    states = session.ctx.conversation.layer_state
    mark = states.get(ENGINE_STATE, lambda: _EngineMark(workflow_id, owner), _EngineMark.from_json)
    mark.workflow_id, mark.owner = workflow_id, owner


def claim_thread(session: Session[Any], kind: str, workflow_id: str, owner: str) -> None:
    """Mark the thread as ``workflow_id``'s (:func:`mark_thread`); a resume of a pause that
    another workflow waits on is refused first (its decisions go to that workflow)."""
    if kind == "resume" and session.paused is not None:
        states = session.ctx.conversation.layer_state
        mark = states.dump(check=False).get(ENGINE_STATE) if ENGINE_STATE in states else None
        if isinstance(mark, Mapping) and mark.get("owner") not in (None, owner):
            raise EngineError(
                f"thread {session.ctx.thread_id!r} is paused inside the durable workflow "
                f"{mark.get('workflow_id')!r}, which waits for its decisions "
                "(approvals='wait'); send them with decide() instead of resuming it in a "
                "new workflow"
            )
    mark_thread(session, workflow_id, owner)


async def drive(
    session: Session[Any],
    request: Mapping[str, Any],
    approvals: str,
    wait_for_decisions: Callable[[Checkpoint], Awaitable[Mapping[str, Any]]],
) -> Any:
    """Run (or resume) the request's run in ``session``; on a pause either end there
    (``approvals="end"``: the Interrupted is the result) or wait durably for decisions
    and resume in the same workflow, again on each new pause."""
    try:
        if request["kind"] == "resume":
            return await session.resume(decisions=decisions_from_document(request["decisions"]))
        return await session.run(decode_messages(request["input"], path="input"))
    except Interrupted as paused:
        if approvals == "end":
            return paused
        while True:
            document = await wait_for_decisions(paused.checkpoint)
            try:
                return await session.resume(decisions=decisions_from_document(document))
            except Interrupted as again:
                paused = again


def unmark_thread(session: Session[Any]) -> None:
    """The workflow's run ended: the thread is the application's again."""
    session.ctx.conversation.layer_state.discard(ENGINE_STATE)


class StepStore:
    """A :class:`~tinyctx.threads.ThreadStore` whose loads and writes are steps of the
    workflow running it (``tinyctx.store.load``, ``tinyctx.store.write``), so a replayed
    workflow sees the thread as its first execution saw it. Lease calls go to the store
    every time (a recovering workflow must really hold the thread); the rest passes
    through. A write refused as stale or fenced is recorded as data and raised again as
    the same error on replay."""

    def __init__(self, store: ThreadStore, runner: StepRunner) -> None:
        self.inner = store
        self.runner = runner

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        async def run() -> Envelope:
            return await run_load(self.inner, thread_id)

        self.runner.next_index()
        envelope = await self.runner.step(
            STORE_LOAD_STEP, thread_id, run, lambda: {"thread_id": thread_id}
        )
        doc = envelope["output"]
        return ThreadRecord(
            thread_id=doc["thread_id"],
            version=doc["version"],
            messages=tuple(doc["messages"]),
            checkpoint=doc["checkpoint"],
            state=doc["state"],
        )

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        digest = _write_digest(thread_id, change, expected_version)

        async def run() -> Envelope:
            try:
                version = await self.inner.write(
                    thread_id, change, expected_version=expected_version, lease=lease
                )
            except (StaleThreadVersion, FencedOut) as exc:
                return {"digest": digest, "output": {"error": _error_document(exc)}}
            return {"digest": digest, "output": {"version": version}}

        index = self.runner.next_index()
        envelope = await self.runner.step(
            STORE_WRITE_STEP,
            digest,
            run,
            lambda: write_payload(thread_id, change, expected_version, lease),
        )
        if envelope.get("digest") != digest:
            from ..steps import NondeterminismError

            raise NondeterminismError(
                STORE_WRITE_STEP, index, self.runner.layers, "the thread write differs"
            )
        output = envelope["output"]
        if "error" in output:
            _raise_recorded(output["error"])
        return int(output["version"])

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        return await self.inner.acquire_lease(thread_id, owner, ttl)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        return await self.inner.renew_lease(lease, ttl)

    async def release_lease(self, lease: Lease) -> None:
        await self.inner.release_lease(lease)

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        return await self.inner.list_threads(prefix=prefix, limit=limit)

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        return await self.inner.archived(thread_id)

    async def delete_thread(self, thread_id: str) -> bool:
        return await self.inner.delete_thread(thread_id)

    async def aclose(self) -> None:
        """The store belongs to the application: closing the view leaves it open."""
