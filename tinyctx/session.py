"""Session: one thread of conversation with an agent, and the task group it owns.

The loop of its runs is :mod:`tinyctx.run_loop`; resuming a paused run, checking a
review and recovering an abandoned step are :mod:`tinyctx.resume`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel

from .agent_core import AgentCore
from .cancel import SchedulerCheckpoint
from .checkpoint import Checkpoint, RunResult
from .codec import encode_messages
from .config import implements, number, optional, text
from .context import RunConfig, RunContext
from .decisions import Decision
from .durable import ThreadLink, ThreadLoaded, default_owner
from .events import SubscriberFailed
from .messages import Message, ToolCall
from .model import ModelRequest
from .resume import ResumePath, refuse_engine_thread
from .run_input import check_turn_input, input_messages
from .run_state import NO_USAGE, RunState
from .tasks import BackgroundTasks
from .threads import ThreadStore
from .tools import ToolRegistry

if TYPE_CHECKING:
    from .agent import Agent
    from .streaming import RunStream

__all__ = ["Session"]

Data = TypeVar("Data")


_NO_IDS_SEEN: tuple[int, Message | None, set[str]] = (0, None, set())

# Session's settings, declared once (ConfigError naming Session.<field>).
_GRACE_PERIOD = number(minimum=0, finite=False, allowed=">= 0 seconds")  # inf: never force
_STORE = optional(implements(ThreadStore), allowed="a tinyctx.threads.ThreadStore or None")
_LEASE_TTL = number(above=0, allowed="a finite number of seconds > 0")
_OWNER = optional(text(), allowed="a non-empty string or None")
"""No message read yet (the set is never written: a count of 0 starts a new one)."""


class Session(ResumePath[Data]):
    """One thread of conversation with an agent; owns the task group for background work.

    ``async with Session(agent, thread_id=..., data=...) as s: result = await s.run("...")``;
    ``s.stream("...")`` reads the same run as typed events (:mod:`tinyctx.streaming`).
    Runs are sequential; leaving the session waits up to ``grace_period`` seconds for
    background work (session-memory extraction), then cancels what is left.

    Queued message events (``conversation.add`` / ``replace``) are flushed exactly once:
    before each model request, when a run ends with an answer, and when the session is
    left (with an error too: a failed run's synthetic results still reach subscribers).

    With ``store=`` (a :class:`~tinyctx.threads.ThreadStore`) the thread is durable (see
    :mod:`tinyctx.durable`): entering takes the thread's lease for ``owner`` (renewed every
    ``lease_ttl / 3`` seconds while the session is open; a second session on the thread gets
    :class:`~tinyctx.threads.LeaseHeld`) and loads the messages, the paused run
    (``resume()`` continues it), the layers' per-thread state and the version. Every
    message is durable before the next model call and before each tool runs, a pause
    stores its checkpoint with its messages in one write, and leaving writes the rest and
    releases the lease. A step a dead worker left with unanswered tool calls is reported
    by :attr:`abandoned`; :meth:`recover` continues or closes it.

    Args:
        agent: The agent to run.
        ctx: A context to run in; else one is made from the arguments below (pass one or
            the other).
        thread_id: The thread's id (a fresh one when None).
        user_id: The user's id, carried in the run config.
        data: The app's data, injected into tools as ``Injected[YourData]``.
        config: The run config the context starts from.
        grace_period: Seconds leaving the session waits for background work.
        store: A ThreadStore to make the thread durable, or None.
        owner: The lease owner's name with a store (host and process by default).
        lease_ttl: Seconds a lease lasts unless renewed.
        **context_options: More ``RunContext.new`` options (stores, tools, events...).
    """

    agent: Agent

    def __init__(
        self,
        agent: Agent,
        *,
        ctx: RunContext[Data] | None = None,
        thread_id: str | None = None,
        user_id: str | None = None,
        data: Data = None,  # type: ignore[assignment]
        config: RunConfig | None = None,
        grace_period: float = 5.0,
        store: ThreadStore | None = None,
        owner: str | None = None,
        lease_ttl: float = 30.0,
        **context_options: Any,
    ) -> None:
        if not isinstance(agent, AgentCore):
            raise TypeError(f"Session needs an Agent, got {type(agent).__name__}")
        _GRACE_PERIOD.check(grace_period, "grace_period", "Session")
        _STORE.check(store, "store", "Session")
        _LEASE_TTL.check(lease_ttl, "lease_ttl", "Session")
        _OWNER.check(owner, "owner", "Session")
        if ctx is None:
            base_config = config or RunConfig()
            overrides: dict[str, Any] = {}
            if thread_id is not None:
                overrides["thread_id"] = thread_id
            if user_id is not None:
                overrides["user_id"] = user_id
            if overrides:
                base_config = base_config.evolve(**overrides)
            ctx = RunContext.new(base_config, data, **context_options)
        elif thread_id is not None or user_id is not None or config is not None or context_options:
            raise TypeError(
                "Session: pass either ctx or thread_id/user_id/config/options, not both"
            )
        tools = ToolRegistry(
            [*agent.tools, *ctx.tools], [*agent.server_tools, *ctx.tools.server_tools]
        )
        self.agent = agent
        self._base: RunContext[Data] = ctx._with(tools=tools, bus=agent.bus)
        # a tool asking for a store or app data this context lacks fails here, not mid-run
        tools.bind(self._base)
        self._grace = grace_period
        self._group: anyio.abc.TaskGroup | None = None
        self._background: BackgroundTasks | None = None
        self._busy = False
        self._current: RunContext[Data] | None = None
        self._paused: Checkpoint | None = None
        self._closed = False
        self._lease_kept: tuple[anyio.Event, anyio.Event] | None = None  # (stop, stopped)
        # tool call ids of the history (how many messages read, the last one, the ids)
        self._ids_seen: tuple[int, Message | None, set[str]] = _NO_IDS_SEEN
        self._abandoned: tuple[ToolCall, ...] = ()
        self._link: ThreadLink | None = None
        self._writing: anyio.Lock | None = None  # made on entering (in its event loop)
        # set while the run of a stream closed early winds down (tinyctx.streaming)
        self._winding: anyio.Event | None = None
        self._template: ModelRequest | None = None  # the last model request (run_loop)
        self._yield = anyio.lowlevel.checkpoint  # the loop's own once entered
        if store is not None:
            self._link = ThreadLink(
                store, self._base.thread_id, owner=owner or default_owner(), ttl=lease_ttl
            )

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def ctx(self) -> RunContext[Data]:
        """The session's context; each run derives its own from it."""
        return self._base

    @property
    def conversation_messages(self) -> tuple[Message, ...]:
        return self._base.conversation.messages

    @property
    def paused(self) -> Checkpoint | None:
        """The checkpoint of an interrupted run waiting for ``resume``, if any."""
        return self._paused

    @property
    def abandoned(self) -> tuple[ToolCall, ...]:
        """Tool calls a dead worker left unanswered (loaded with no checkpoint): a step
        that :meth:`recover` continues or closes. Empty when there is none."""
        return self._abandoned

    @property
    def thread_version(self) -> int | None:
        """The stored thread's version as this session last wrote or loaded it (None
        without a store)."""
        return self._link.version if self._link is not None else None

    async def __aenter__(self) -> Session[Data]:
        if self._group is not None or self._closed:
            raise RuntimeError("a Session can be entered once")
        link = self._link
        if link is not None:
            started = time.perf_counter()
            paused, abandoned = await link.open(self._base.conversation)
            self._paused, self._abandoned = paused, abandoned
            self._base.emit(
                ThreadLoaded,
                version=link.version,
                messages=len(self._base.conversation),
                paused=paused is not None,
                abandoned_calls=tuple(c.id for c in abandoned),
                owner=link.owner,
                seconds=time.perf_counter() - started,
            )
        if link is not None:
            self._writing = anyio.Lock()  # only writes take it
        self._yield = SchedulerCheckpoint()
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._background = BackgroundTasks(group, self._base.events)
        self._base = self._base._with(background=self._background)
        if link is not None:
            self._base = self._base._with(
                lease_source=link.current_lease,
                lease_store=link.store,
                commit_source=_weak_commit(self),
            )
            self._lease_kept = (stop, kept) = (anyio.Event(), anyio.Event())
            group.start_soon(link.keep_leased, self._base, stop, kept, name="tinyctx.lease")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        group, background = self._group, self._background
        assert group is not None
        assert background is not None
        self._closed = True
        try:
            # message events still queued (a failed run's synthetic results, messages added
            # between runs) reach persistence exactly once, however the block is left
            if exc_info[0] is None:
                await self._base.conversation.flush()
            else:
                await self._flush_on_error()
        finally:
            # from here on, leaving is shielded from the host's cancellation (a caller's
            # deadline) and each step bounded: the group's scope is the one the session's
            # block ran in, so its shield covers this task and the background work still
            # running; on trio an unshielded exit re-raised the deadline out of the group's
            # exit and skipped the last write and the lease release
            group.cancel_scope.shield = True
            if background.running:
                # shielded from the group's own scope too: on asyncio a child the deadline
                # cancelled before the shield was set cancels the group as it ends
                with anyio.CancelScope(shield=True), anyio.move_on_after(self._grace):
                    await background.wait_idle()
            background.close()
            if self._lease_kept is not None:
                # the lease keeper ends by itself (see ThreadLink.keep_leased); cancelled
                # only if a renewal in flight outlasts the grace
                stop, kept = self._lease_kept
                stop.set()
                with anyio.CancelScope(shield=True), anyio.move_on_after(max(self._grace, 1.0)):
                    await kept.wait()
            group.cancel_scope.cancel()
            try:
                # our children never raise (BackgroundTasks reports their errors), so the
                # host's exception keeps propagating as itself, never in an ExceptionGroup
                await group.__aexit__(None, None, None)
            finally:
                if self._link is not None:
                    await self._close_thread(failing=exc_info[0] is not None)

    async def _close_thread(self, *, failing: bool) -> None:
        """Write what is left (the background work's state too) and release the lease."""
        link = self._link
        assert link is not None
        try:
            await self._sync(failing=failing)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(max(self._grace, 1.0)):
                try:
                    await link.release()
                except Exception as exc:  # the lease expires by itself; the write mattered
                    self._base.emit(SubscriberFailed, subscriber="lease", error=str(exc))

    async def _commit(self, ctx: RunContext[Any]) -> None:
        """``ctx.commit()`` of this session's contexts: write what the session's
        conversation committed since the last write (a context of another conversation,
        a sub-agent's or an extraction's, has nothing of this thread to write)."""
        conversation = self._base.conversation
        if ctx.conversation is conversation and conversation.changes():
            await self._sync()

    async def _flush_on_error(self) -> None:
        """Deliver queued message events while an exception leaves the session.

        Shielded (the host may be cancelled, e.g. a caller's timeout) and bounded by the
        grace period; a subscriber's failure is reported as an event, never raised over
        the exception already in flight.
        """
        conversation = self._base.conversation
        with anyio.CancelScope(shield=True), anyio.move_on_after(max(self._grace, 1.0)):
            while conversation.queued_events:
                try:
                    await conversation.flush()
                except Exception as exc:  # the run's own error stays the one raised
                    self._base.emit(
                        SubscriberFailed,
                        subscriber="conversation.subscribe",
                        error=f"{type(exc).__name__}: {exc}",
                        event_kind="message",
                    )

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the session for good: the current run stops at its next checkpoint and no
        later run starts (see :meth:`cancel_run` to stop only the current one)."""
        self._base.cancellation.cancel(reason)

    def cancel_run(self, reason: str | None = None) -> bool:
        """Stop the run in progress at its next checkpoint ("stop generating"); the session
        stays usable. False when no run is in progress."""
        current = self._current
        if current is None:
            return False
        current.cancellation.cancel(reason)
        return True

    # -- running -------------------------------------------------------------------------

    def stream(self, input: str | Message | Sequence[Message] | None) -> RunStream:
        """:meth:`run` as an async iterator of typed stream events, ending with
        :class:`~tinyctx.streaming.FinalResult` (or :class:`~tinyctx.streaming.RunPaused`);
        closing it early cancels the run. See :mod:`tinyctx.streaming`."""
        from .streaming import RunStream

        return RunStream(self, lambda: self.run(input), None)

    def stream_resume(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
    ) -> RunStream:
        """:meth:`resume` as a stream of events, like :meth:`stream`."""
        from .streaming import RunStream

        paused = checkpoint or self._paused
        return RunStream(
            self,
            lambda: self.resume(checkpoint, decisions=decisions),
            paused.run_id if paused is not None else None,
        )

    async def run(self, input: str | Message | Sequence[Message] | None) -> RunResult:
        """Add ``input`` (text, a message or messages) and run until the run ends.

        Input that would break the pairing rule (a result answering no call, a call left
        without its result, a call id the thread used already) raises ``PairingError``
        naming ``input[i]`` and the id, before anything is appended; with a store, input
        the store cannot keep (metadata that is not JSON) raises ``CodecError`` naming
        ``input[i]`` and the field, before anything is appended too. Text from outside
        (input, model output, tool results) enters history valid: lone surrogates become
        U+FFFD; a call id the model reuses is renamed (``renamed_ids`` in the metadata)."""
        if self._winding is not None:
            await self._ready()
        self._enter_run()
        try:
            messages = input_messages(input)
            check_turn_input(
                *self._base.conversation.last_turn(),  # not a copy of the whole history
                messages,
                self._call_ids,
                # a pause's (or a dead worker's) pending calls are answered before the input
                paused=self._paused is not None or bool(self._abandoned),
            )
            if self._link is not None:
                # what the store cannot keep (metadata that is not JSON, a Message type the
                # codec does not know) is refused here, not found by the next write: once in
                # the conversation it would fail every write of the session
                encode_messages(messages, path="input")
            if self._paused is not None:
                refuse_engine_thread(self._base, self._link.owner if self._link else None)
                await self._abandon_pause()
            if self._abandoned:
                await self._close_abandoned()
            ctx = self._base._for_run()
            state = RunState(ctx, usage_before=NO_USAGE)
            return await self._drive(state, "before_model", (), input=messages, resumed=False)
        finally:
            self._busy = False


def _weak_commit(session: Session[Any]) -> Callable[[RunContext[Any]], Awaitable[None]]:
    """The session's ``ctx.commit()``, through a weak reference: its contexts hold it, and
    a session that referenced its context back would keep its whole conversation alive
    after it closed, until the cyclic collector came by."""
    method = weakref.WeakMethod(session._commit)

    async def commit(ctx: RunContext[Any]) -> None:
        bound = method()
        if bound is not None:
            await bound(ctx)

    return commit
