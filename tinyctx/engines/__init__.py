"""tinyctx runs on durable-execution engines: :mod:`tinyctx.engines.dbos` and
:mod:`tinyctx.engines.temporal` (optional extras ``tinyctx[dbos]``, ``tinyctx[temporal]``).

What the engines share lives here: the thread store seen through steps
(:class:`StepStore`), the idempotency key of a run (:func:`workflow_id_for`), the lease
owner a workflow uses (:func:`lease_owner`), and what a finished workflow hands back
(:class:`EngineResult`). The steps themselves are :mod:`tinyctx.steps`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import field, frozen

from ..agent import ENGINE_STATE, Session
from ..codec import decode_messages, encode_messages
from ..decisions import Decision, decisions_from_json
from ..errors import TinyCtxError
from ..messages import Message, UserMessage
from ..steps import Envelope, StepRunner
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
    "STORE_LOAD_STEP",
    "STORE_WRITE_STEP",
    "EngineError",
    "EngineResult",
    "StepStore",
    "WorkflowFailed",
    "decisions_document",
    "decisions_from_document",
    "input_documents",
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
        "on an asyncio event loop (anyio.run(main, backend='asyncio'))"
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
    status: Literal["completed", "stopped"]
    final_text: str
    run_id: str
    thread_id: str
    model_calls: int
    tool_calls: int
    messages: tuple[Message, ...] = field(repr=False)


def result_document(workflow_id: str, result: Any) -> dict[str, Any]:
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

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def to_json(self) -> dict[str, str]:
        return {"workflow_id": self.workflow_id}

    @classmethod
    def from_json(cls, data: Any) -> _EngineMark:
        return cls(str(data["workflow_id"]))


def mark_thread(session: Session[Any], workflow_id: str) -> None:
    """Record in the thread (written with its next write) that ``workflow_id`` owns its
    run: ``Session.recover`` then refuses the thread, as the engine finishes the run."""
    states = session.ctx.conversation.layer_state
    mark = states.get(ENGINE_STATE, lambda: _EngineMark(workflow_id), _EngineMark.from_json)
    mark.workflow_id = workflow_id


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
