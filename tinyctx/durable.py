"""A Session's link to a :class:`~tinyctx.threads.ThreadStore`: load, write, lease.

``Session(agent, thread_id=..., store=store)`` uses one :class:`ThreadLink`. On entering
it takes the thread's lease (a second session on a leased thread gets
:class:`~tinyctx.threads.LeaseHeld`, a :class:`~tinyctx.SessionBusy` naming the thread
and the owner) and loads the thread: messages, the paused run's checkpoint, the layers'
per-thread state and the version. While the session is open a task in its task group
renews the lease every third of its TTL; a worker that dies stops renewing, and its lease
expires after the TTL.

Every write is one atomic :meth:`~tinyctx.threads.ThreadStore.write` against the version
last seen and under the lease: what the conversation changed since the last write (a
compaction as a replaced range, then the appended messages — cost O(new messages)), the
checkpoint when a run pauses or its clearing when the run goes on, and the layers'
per-thread state when it changed. A write refused as stale or fenced raises as is:
nothing is ever overwritten silently.

All decisions stay in the session and its layers; the store only stores.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
from attrs import frozen

from .codec import (
    StateEncoder,
    decode_checkpoint,
    decode_messages,
    decode_state,
    encode_checkpoint,
    encode_messages,
)
from .events import Event, EventLevel
from .frozen import thaw
from .messages import Message, ToolCall, pending_tool_calls
from .threads import (
    UNCHANGED,
    Compaction,
    FencedOut,
    Lease,
    LeaseHeld,
    ThreadStore,
    ThreadWrite,
    Unchanged,
)

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .context import RunContext
    from .conversation import Conversation
    from .state import LayerStates

__all__ = [
    "ThreadLink",
    "ThreadLoaded",
    "ThreadWriteFailed",
    "LeaseRenewFailed",
    "AbandonedStepClosed",
    "ENGINE_STATE",
    "default_owner",
    "take_lock",
]

ENGINE_STATE = "tinyctx.engine"
"""The per-thread state a durable-engine workflow keeps while it owns the thread's run."""


async def take_lock(lock: anyio.Lock) -> None:
    """Take ``lock``, at once when it is free: no trip through the scheduler (a durable
    step takes the session's write lock for each of its writes)."""
    try:
        lock.acquire_nowait()
    except anyio.WouldBlock:
        await lock.acquire()


def default_owner() -> str:
    """``host:pid:random``: unique per Session, readable in a LeaseHeld message."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@frozen
class ThreadLoaded(Event):
    """A session loaded its thread from the store; ``seconds`` it took to lease, read and
    decode it (what one Session per request adds to each request)."""

    kind: ClassVar[str] = "thread.loaded"
    level: ClassVar[EventLevel] = "info"
    version: int = 0
    messages: int = 0
    paused: bool = False
    abandoned_calls: tuple[str, ...] = ()
    owner: str = ""
    seconds: float = 0.0


@frozen
class ThreadWriteFailed(Event):
    """A write to the thread's store failed while another error was already leaving."""

    kind: ClassVar[str] = "thread.write_failed"
    level: ClassVar[EventLevel] = "error"
    error: str = ""


@frozen
class LeaseRenewFailed(Event):
    """Renewing the thread's lease failed (``lost``: another worker holds it now)."""

    kind: ClassVar[str] = "thread.lease_renew_failed"
    level: ClassVar[EventLevel] = "warning"
    error: str = ""
    lost: bool = False


@frozen
class AbandonedStepClosed(Event):
    """A step a dead worker left open was continued or closed (``mode``)."""

    kind: ClassVar[str] = "thread.abandoned_step"
    level: ClassVar[EventLevel] = "info"
    mode: str = ""
    tool_call_ids: tuple[str, ...] = ()


def _drop_foreign_engine_mark(states: LayerStates, owner: str) -> None:
    """Forget the mark of a workflow that leased the thread as another owner.

    A write made under this owner's lease moves the thread past any version that workflow
    knows, so its next write (a replay's too) is refused as stale or fenced: it can never
    finish the run. Its mark, kept, would have ``recover`` and ``resume`` refuse the thread
    for good; it goes with this write.
    """
    mark = states.dump(check=False).get(ENGINE_STATE)
    if not (isinstance(mark, Mapping) and mark.get("owner") == owner):
        states.discard(ENGINE_STATE)


class ThreadLink:
    """One Session's view of its thread in a store (see the module docstring)."""

    __slots__ = (
        "checkpoint",
        "lease",
        "lost",
        "owner",
        "released",
        "run_id",
        "state_encoder",
        "state_json",
        "store",
        "thread_id",
        "ttl",
        "version",
    )

    def __init__(self, store: ThreadStore, thread_id: str, *, owner: str, ttl: float) -> None:
        self.store = store
        self.thread_id = thread_id
        self.owner = owner
        self.ttl = ttl
        self.lease: Lease | None = None
        self.version = 0
        # what the next write does to the stored checkpoint (a document, None: clear)
        self.checkpoint: str | Unchanged | None = UNCHANGED
        # the layer state as last written (compared, so unchanged state is not rewritten)
        self.state_json: dict[str, Any] | None = None
        # what was last encoded of it (an unchanged frozen part is not encoded again)
        self.state_encoder = StateEncoder()
        self.lost: FencedOut | None = None
        self.released: Lease | None = None
        # the run each write is recorded under (tinyctx.versions): the current run's
        self.run_id: str | None = None

    # -- entering ------------------------------------------------------------------------

    async def open(
        self, conversation: Conversation
    ) -> tuple[Checkpoint | None, tuple[ToolCall, ...]]:
        """Lease and load the thread into ``conversation`` (which must be empty).

        Returns the paused run's checkpoint (if any) and the tool calls a dead worker left
        open (the thread's history ends with unanswered calls and no checkpoint).
        """
        if len(conversation):
            raise ValueError(
                f"Session(store=...): thread {self.thread_id!r} is loaded from the store into "
                f"an empty conversation; this one has {len(conversation)} messages"
            )
        try:
            self.lease = await self.store.acquire_lease(self.thread_id, self.owner, self.ttl)
        except (LeaseHeld, ValueError, TypeError):
            raise  # refused: nothing was granted
        except BaseException:
            # a cancellation or a dropped connection may have lost the grant's reply: a
            # live lease this owner holds now is the one just granted; give it up
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._bound):
                await self._release_unacknowledged()
            raise
        try:
            record = await self.store.load_thread(self.thread_id)
            messages = decode_messages(record.messages)
            state = decode_state(record.state) if record.state is not None else None
            checkpoint = (
                decode_checkpoint(record.checkpoint) if record.checkpoint is not None else None
            )
        except BaseException:
            # shielded and bounded (a stalled server must not hold the caller, whose
            # deadline may be what ended the load); the lease expires by itself, and the
            # error that ended the load is the one raised
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(self._bound),
                contextlib.suppress(Exception),
            ):
                await self.release()
            raise
        conversation.replace(messages, emit_new=False)
        conversation.mark_synced()
        conversation.layer_state.load(thaw(state) if state is not None else None)
        self.state_json = conversation.layer_state.dump()
        self.version = record.version
        open_calls: tuple[ToolCall, ...] = ()
        if checkpoint is not None:
            if checkpoint.messages == conversation.messages:
                # one history in memory: the paused run continues on the loaded log itself
                checkpoint = checkpoint.evolve(messages=conversation.messages)
        else:
            open_calls = pending_tool_calls(conversation.messages)
        return checkpoint, open_calls

    @property
    def _bound(self) -> float:
        """How long a release on the way out may take: past the TTL it expires anyway."""
        return min(self.ttl, 5.0)

    async def _release_unacknowledged(self) -> None:
        try:
            lease = (await self.store.load_thread(self.thread_id)).lease
            if lease is not None and lease.owner == self.owner and lease.expires_at > time.time():
                self.released = lease
                await self.store.release_lease(lease)
        except Exception:  # the lease expires by itself; the acquire's error is raised
            pass

    # -- writing -------------------------------------------------------------------------

    def pause(self, checkpoint: Checkpoint) -> None:
        """The next write stores ``checkpoint`` (with the messages of the same step)."""
        self.checkpoint = encode_checkpoint(checkpoint)

    def unpause(self) -> None:
        """The next write clears the stored checkpoint (its run went on or was abandoned)."""
        self.checkpoint = None

    async def sync(self, conversation: Conversation) -> bool:
        """Write what changed since the last write; False when nothing had."""
        change = conversation.changes()
        point = conversation.sync_point()  # O(1): no copy of the history per write
        states = conversation.layer_state
        if ENGINE_STATE in states:
            _drop_foreign_engine_mark(states, self.owner)
        state = states.dump(check=False)  # the encoder checks it
        state_doc: str | Unchanged = UNCHANGED
        if state != self.state_json:
            state_doc = self.state_encoder.encode(state)
        checkpoint = self.checkpoint
        if not change and state_doc is UNCHANGED and checkpoint is UNCHANGED:
            return False
        # an error names the message by its place in the conversation
        compaction = None
        if change.compaction:
            replacement = encode_messages(
                change.replacement, path="conversation", start=change.start
            )
            compaction = Compaction(change.start, change.end, replacement)
        appended = change.appended
        write = ThreadWrite(
            append=encode_messages(
                appended, path="conversation", start=point.length - len(appended)
            ),
            compaction=compaction,
            checkpoint=checkpoint,
            state=state_doc,
            run_id=self.run_id,
        )
        try:
            self.version = await self.store.write(
                self.thread_id, write, expected_version=self.version, lease=self.lease
            )
        except Exception:
            # the reply may be what was lost (a connection dropped after the commit, or a
            # driver's retry of a write that had landed refused as stale): if the store
            # holds exactly this write, it landed; anything else is the error it says
            landed = await self._landed(write, conversation.logged_at(point), state_doc)
            if landed is None:
                raise
            self.version = landed
        conversation.mark_synced(point)  # what changed while writing stays pending
        self.checkpoint = UNCHANGED
        if state_doc is not UNCHANGED:
            self.state_json = state
        return True

    async def _landed(
        self,
        write: ThreadWrite,
        written: tuple[Message, ...] | None,
        state_doc: str | Unchanged,
    ) -> int | None:
        """The version ``write`` made when the store holds it (one version on from ours,
        with exactly the conversation and the checkpoint and state it wrote), else None;
        None as well when the store cannot be read now (or the conversation written is
        not known any more)."""
        if written is None:
            return None
        try:
            record = await self.store.load_thread(self.thread_id)
            if record.version != self.version + 1 or len(record.messages) != len(written):
                return None
            if write.checkpoint is not UNCHANGED and record.checkpoint != write.checkpoint:
                return None
            if state_doc is not UNCHANGED and record.state != state_doc:
                return None
            if decode_messages(record.messages) != written:
                return None
        except Exception:
            return None
        return record.version

    # -- the lease -----------------------------------------------------------------------

    def current_lease(self) -> Lease | None:
        """The lease taken on open (as last renewed), even once lost or released: a write
        fenced by it after that is refused, never let through unfenced. What
        ``ctx.thread_lease()`` reads."""
        return self.lease if self.lease is not None else self.released

    async def keep_leased(
        self, ctx: RunContext[Any], stop: anyio.Event, stopped: anyio.Event
    ) -> None:
        """Renew the lease every third of its TTL until ``stop`` is set (the session's
        task), then set ``stopped``. It ends by itself rather than by cancellation: on
        asyncio, anyio keeps a cancelled task's exception in a reference cycle with the
        frames it passed through, this one's ``ctx`` among them, and so the session's whole
        conversation would stay alive until the cyclic collector came by."""
        try:
            while True:
                with anyio.move_on_after(self.ttl / 3):
                    await stop.wait()
                lease = self.lease
                if stop.is_set() or lease is None:
                    return
                try:
                    self.lease = await self.store.renew_lease(lease, self.ttl)
                except FencedOut as exc:
                    self.lost = exc
                    ctx.emit(LeaseRenewFailed, error=str(exc), lost=True)
                    return
                except Exception as exc:  # a store hiccup: the next period tries again
                    ctx.emit(LeaseRenewFailed, error=f"{type(exc).__name__}: {exc}")
        finally:
            stopped.set()

    async def release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            self.released = lease
            await self.store.release_lease(lease)
