"""Agent, Session and the loop with its named checkpoints.

One run: checkpoint ``before_model`` → model onion → append the assistant message →
checkpoint ``after_model`` → for each tool call: checkpoint ``before_tool`` → tool onion →
append the result → checkpoint ``after_tools`` → loop until a final answer, a
StopWithFinal, an Interrupt, a limit or cancellation.

At every checkpoint the loop checks the cancellation token and drains the control slot.
Whatever ends the run, the conversation keeps the pairing invariant: tool calls that will
not run are answered with a clear synthetic result (an interrupted run keeps them pending
so ``Session.resume`` can run them).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import anyio
import attrs
from attrs import field, frozen

from .chain import (
    Layer,
    LayerBus,
    LayerLike,
    ModelCall,
    ToolCallHandler,
    check_layer_names,
    compose,
    has_hook,
)
from .context import RunConfig, RunContext
from .control import _RESUMING, Control, Interrupt, Resumption, StopWithFinal, Suspend, stronger
from .conversation import Conversation
from .decisions import DECISION_TYPES, Decision
from .errors import (
    ConfigError,
    Interrupted,
    InvalidCheckpoint,
    LimitExceeded,
    PairingError,
    ResumeError,
    RunCancelled,
    SessionBusy,
    TinyCtxError,
    ToolError,
)
from .events import (
    Cancelled,
    ControlApplied,
    Event,
    LimitHit,
    ModelCallFinished,
    PendingCallsAnswered,
    RunFinished,
    RunStarted,
    SubscriberFailed,
    ToolCallFinished,
    ToolCallStarted,
    ToolCallSuspended,
    ToolFailed,
)
from .frozen import EMPTY, MAX_NESTING, FrozenDict, freeze, frozen_mapping, thaw
from .messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    UserMessage,
    answer_pending,
    call_ids,
    check_messages,
    check_pairing,
    fresh_call_ids,
    pending_tool_calls,
    valid_message,
)
from .model import ModelHandler, ModelRequest, ModelResponse, Usage
from .ordering import check_ordering
from .parts import PART_TYPES
from .request_rules import RequestRule, supports_prefill
from .stores import WriteOutcomeUnknown
from .tasks import BackgroundTasks
from .thread_usage import record_run
from .threads import ThreadStore
from .tools import ServerTool, Tool, ToolArgumentError, ToolRegistry

if TYPE_CHECKING:
    from .durable import ThreadLink
    from .streaming import RunStream

__all__ = [
    "Agent",
    "Session",
    "RunResult",
    "Checkpoint",
    "RunStatus",
    "execute_tool",
    "invoke_tool",
    "tool_error_result",
]

Data = TypeVar("Data")
RunStatus = Literal["completed", "stopped"]
Phase = Literal["before_model", "tools"]

SKIPPED_ON_STOP = "[skipped: the run was stopped with a final answer before this tool ran]"
SKIPPED_ON_CANCEL = "[not run: the run was cancelled before this tool ran]"
SKIPPED_ON_ABANDON = "[not run: the run was interrupted and not resumed]"
SKIPPED_ON_CRASH = (
    "[interrupted: the worker running this step stopped before its result was saved; "
    "the call may or may not have run]"
)


# ---------------------------------------------------------------------------------------
# the core tool handler


async def invoke_tool(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    """The innermost tool handler: resolve and run the tool; a failure raises ToolError.

    An unknown tool, arguments that were not JSON or do not match the tool's signature,
    and an exception the tool raised all become a :class:`~tinyctx.ToolError` (the
    original exception is its ``error``), so tool layers see the failure and may retry
    or answer it. The loop turns a ToolError that reaches the onion's outer edge into an
    ``is_error`` result the model can read (:func:`tool_error_result`).
    Cancellation and interrupts propagate unwrapped; they are not the tool's failure.
    """
    tool = ctx.tools.get(call.name)
    if tool is None:
        known = ", ".join(ctx.tools.names) or "none"
        raise ToolError(
            call, "UnknownTool", f"unknown tool {call.name!r}; available tools: {known}"
        )
    if call.invalid_arguments is not None:
        raise ToolError(
            call,
            "InvalidArguments",
            f"arguments for {call.name!r} are not a JSON object (nested at most {MAX_NESTING} "
            f"levels): {call.invalid_arguments[:200]!r}",
        )
    try:
        output: object = await tool.invoke(call.arguments, ctx)
    except (RunCancelled, Interrupted):
        raise
    except ToolArgumentError as exc:
        raise ToolError(call, "InvalidArguments", str(exc), exc) from exc
    except Exception as exc:
        raise ToolError(call, type(exc).__name__, str(exc) or type(exc).__name__, exc) from exc
    if isinstance(output, ToolResult):
        if output.tool_call_id != call.id or output.name != call.name:
            output = attrs.evolve(output, tool_call_id=call.id, name=call.name)
        return output
    if isinstance(output, tuple) and output and all(isinstance(p, PART_TYPES) for p in output):
        return ToolResult.for_call(call, output)
    if not isinstance(output, str):
        output = json.dumps(thaw(output), default=str, ensure_ascii=False)
    return ToolResult.for_call(call, output)


def tool_error_result(
    ctx: RunContext[Any], call: ToolCall, error: ToolError, text: str | None = None
) -> ToolResult:
    """The ``is_error`` result the model reads for a failed call, and its ToolFailed event.

    The content is the error's ``content`` (``Error (<error_type>): <text>`` unless a layer
    set it) or ``text`` when given.
    """
    ctx.emit(
        ToolFailed,
        tool=call.name,
        tool_call_id=call.id,
        error_type=error.error_type,
        error=error.text,
    )
    content = error.content if text is None else text
    return ToolResult.for_call(call, content, is_error=True)


async def execute_tool(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    """Run one call outside any onion: :func:`invoke_tool`, a failure as an error result.

    The model always gets a result it can read, exactly as the loop gives it.
    """
    try:
        return await invoke_tool(call, ctx)
    except ToolError as exc:
        return tool_error_result(ctx, call, exc)


# ---------------------------------------------------------------------------------------
# agent


def _tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


def _model_handler(model: ModelHandler | str) -> ModelHandler:
    if isinstance(model, str):
        from .models_by_name import resolve_model

        return resolve_model(model)
    return model


@frozen(eq=False)
class Agent:
    """A model, its tools and its middleware: immutable and reusable across sessions.

    Both onions are composed here, once. ``model`` is a model handler or a model by name,
    ``"<prefix>:<model>"`` (``"openai:gpt-4o"``, ``"anthropic:claude-sonnet-4-5"``; see
    :mod:`tinyctx.models_by_name`), which also sets ``model_name`` when it is not given.
    """

    model: ModelHandler = field(converter=_model_handler)
    tools: tuple[Tool, ...] = field(default=(), converter=_tuple)
    middleware: tuple[LayerLike, ...] = field(default=(), converter=_tuple)
    system_prompt: str | None = None
    model_name: str | None = None
    settings: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    server_tools: tuple[ServerTool, ...] = field(default=(), converter=_tuple)
    name: str = "agent"
    check_requests: bool = field(default=True, kw_only=True)
    """Refuse a request a layer emptied or left ending in an assistant message the model
    cannot continue (:mod:`tinyctx.request_rules`); False sends whatever the layers make."""
    run_start_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    run_end_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    resume_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    checkpoint_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    model_onion: ModelCall = field(init=False, repr=False)
    request_rule: RequestRule = field(init=False, repr=False)
    tool_onion: ToolCallHandler = field(init=False, repr=False)
    bus: LayerBus = field(init=False, repr=False)
    registry: ToolRegistry = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.model_name is None:
            from .models_by_name import name_of

            object.__setattr__(self, "model_name", name_of(self.model))
        if not callable(self.model):
            raise TypeError("Agent.model must be an async callable (request, ctx) -> ModelResponse")
        check_layer_names(self.middleware)
        check_ordering(self.middleware)
        object.__setattr__(self, "registry", ToolRegistry(self.tools, self.server_tools))
        rule = RequestRule(supports_prefill(self.model))
        object.__setattr__(self, "request_rule", rule)
        object.__setattr__(
            self,
            "model_onion",
            compose(
                self.middleware,
                _committed_first(self.model),
                rule=rule if self.check_requests else None,
            ),
        )
        object.__setattr__(self, "tool_onion", compose(self.middleware, invoke_tool, hook="tool"))
        object.__setattr__(self, "bus", LayerBus(self.middleware))
        layers = [m for m in self.middleware if isinstance(m, Layer)]
        starts = tuple(m for m in layers if has_hook(m, "run_start"))
        ends = tuple(m for m in reversed(layers) if has_hook(m, "run_end"))
        object.__setattr__(self, "run_start_hooks", starts)
        object.__setattr__(self, "run_end_hooks", ends)
        resumes = tuple(m for m in layers if has_hook(m, "resume"))
        object.__setattr__(self, "resume_hooks", resumes)
        hooks = tuple(m for m in layers if has_hook(m, "checkpoint"))
        object.__setattr__(self, "checkpoint_hooks", hooks)

    def evolve(self, **changes: Any) -> Agent:
        if "model" in changes and "model_name" not in changes:
            from .models_by_name import name_of

            if self.model_name is not None and self.model_name == name_of(self.model):
                changes["model_name"] = None  # the name came with the model it replaces
        return attrs.evolve(self, **changes)

    async def run(
        self, input: str | Message | Sequence[Message], **session_options: Any
    ) -> RunResult:
        """One run in a fresh session (``async with Session(self, ...)``)."""
        async with Session(self, **session_options) as session:
            return await session.run(input)

    def run_sync(
        self,
        input: str | Message | Sequence[Message],
        *,
        backend: Literal["trio", "asyncio"] = "trio",
        **session_options: Any,
    ) -> RunResult:
        """:meth:`run` for scripts: starts an event loop (``backend``), runs, returns.

        Called where an event loop is running (a notebook cell, async code) it raises
        RuntimeError at once, saying to ``await agent.run(...)`` there instead.
        """
        from .blocking import run_blocking

        return run_blocking(self.run, input, backend=backend, **session_options)


def _committed_first(model: ModelHandler) -> ModelHandler:
    """The onion's core: what the conversation committed on the way in (a persistent
    compaction, a relief) is made durable (:meth:`RunContext.commit`), then the model is
    called; a store that cannot take the write fails the call before the model runs."""

    async def call_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        if ctx.commit_source is not None:
            await ctx.commit_source(ctx)
        return await model(request, ctx)

    return call_model


# ---------------------------------------------------------------------------------------
# results and checkpoints


@frozen
class RunResult:
    """What one run produced: the final text, the messages it added, usage and events."""

    final_text: str
    messages: tuple[Message, ...]
    usage: Usage
    status: RunStatus
    run_id: str
    thread_id: str
    model_calls: int
    tool_calls: int
    events: tuple[Event, ...] = field(default=(), repr=False)


@frozen
class Checkpoint:
    """Where an interrupted run stopped; ``Session.resume(checkpoint)`` continues it.

    Self-contained: it carries the conversation at the pause, so a new session of the
    same thread can resume it too.
    """

    run_config: RunConfig
    phase: Phase
    pending: tuple[ToolCall, ...]
    node: str
    message: str
    messages: tuple[Message, ...] = field(repr=False)
    added: tuple[Message, ...] = field(repr=False)
    model_calls: int = 0
    tool_calls: int = 0
    usage: Usage = field(factory=Usage)
    state: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping, repr=False)
    """Per-run layer state at the pause, keyed by layer name (JSON-compatible values)."""
    payload: Any = None
    """The Interrupt's structured payload (JSON data, deep-frozen), or None."""

    @property
    def run_id(self) -> str:
        return self.run_config.run_id

    @property
    def thread_id(self) -> str:
        return self.run_config.thread_id

    def evolve(self, **changes: Any) -> Checkpoint:
        return attrs.evolve(self, **changes)

    def check(self) -> None:
        """Refuse a checkpoint that cannot be resumed as it is (hand-edited, corrupted).

        Its history must keep pairing, and its pending calls must be exactly the open
        calls of that history (phase ``tools``), or there must be none (``before_model``).
        Raises :class:`InvalidCheckpoint` naming what is wrong.
        """
        where = f"checkpoint of run {self.run_id!r}"
        if self.phase not in ("before_model", "tools"):
            raise InvalidCheckpoint(
                f"{where}: phase {self.phase!r} is not 'before_model' or 'tools'"
            )
        try:
            check_pairing(self.messages)
        except PairingError as exc:
            raise InvalidCheckpoint(
                f"{where}: its history breaks tool-call pairing: {exc}"
            ) from exc
        open_calls = pending_tool_calls(self.messages)
        if self.phase == "before_model" and (self.pending or open_calls):
            ids = [c.id for c in self.pending or open_calls]
            raise InvalidCheckpoint(
                f"{where}: phase 'before_model' with open tool calls {ids}; expected none"
            )
        if self.phase == "tools" and self.pending != open_calls:
            raise InvalidCheckpoint(
                f"{where}: pending calls {[c.id for c in self.pending]} are not the open calls "
                f"of its history {[c.id for c in open_calls]}"
            )


_NO_USAGE = Usage()


class _RunState:
    __slots__ = (
        "added",
        "cancel_reported",
        "ctx",
        "events",
        "input_after_tools",
        "model_calls",
        "resumed_call",
        "resuming",
        "tool_calls",
        "usage_before",
        "usage_start",
    )

    def __init__(self, ctx: RunContext[Any], *, usage_before: Usage) -> None:
        self.ctx = ctx
        # the checkpoint a resume starts from, until the run goes past its start hooks
        self.resuming: Checkpoint | None = None
        # the suspended call a resume runs again (its id) and what it resumes with
        self.resumed_call: tuple[str, Resumption] | None = None
        self.cancel_reported = False
        # a resume's new input, added after the resumed calls' results (same write)
        self.input_after_tools: tuple[Message, ...] = ()
        self.added: list[Message] = []
        self.model_calls = 0
        self.tool_calls = 0
        # the run's usage: what the session's tracker adds from here, plus what the run
        # used before its pause (a resumed run's checkpoint carries it, whichever session
        # or process paused it: the tracker here may never have seen it)
        self.usage_start = ctx.usage.total()
        self.usage_before = usage_before
        self.events: list[Event] = []

    def usage(self) -> Usage:
        """The run's usage so far, its part before a pause included."""
        used = self.ctx.usage.total() - self.usage_start
        before = self.usage_before
        return used if before == _NO_USAGE else before + used


class _Finished(Exception):
    """Internal: unwinds the loop with a result (never escapes the session)."""

    def __init__(self, result: RunResult) -> None:
        self.result = result


# ---------------------------------------------------------------------------------------
# session


class Session(Generic[Data]):
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
    """

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
        if not isinstance(agent, Agent):
            raise TypeError(f"Session needs an Agent, got {type(agent).__name__}")
        if grace_period < 0:
            raise ConfigError("grace_period", grace_period, ">= 0 seconds", owner="Session")
        if store is not None and not isinstance(store, ThreadStore):
            raise ConfigError(
                "store", store, "a tinyctx.threads.ThreadStore or None", owner="Session"
            )
        if (
            isinstance(lease_ttl, bool)
            or not isinstance(lease_ttl, int | float)
            or not 0 < lease_ttl < float("inf")
        ):
            raise ConfigError(
                "lease_ttl", lease_ttl, "a finite number of seconds > 0", owner="Session"
            )
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigError("owner", owner, "a non-empty string or None", owner="Session")
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
        self._ids_seen: tuple[int, Message | None, set[str]] = (0, None, set())
        self._abandoned: tuple[ToolCall, ...] = ()
        self._link: ThreadLink | None = None
        self._writing: anyio.Lock | None = None  # made on entering (in its event loop)
        # set while the run of a stream closed early winds down (tinyctx.streaming)
        self._winding: anyio.Event | None = None
        if store is not None:
            from .durable import ThreadLink, default_owner

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
            from .durable import ThreadLoaded

            self._base.emit(
                ThreadLoaded,
                version=link.version,
                messages=len(self._base.conversation),
                paused=paused is not None,
                abandoned_calls=tuple(c.id for c in abandoned),
                owner=link.owner,
                seconds=time.perf_counter() - started,
            )
        self._writing = anyio.Lock()
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

    async def _sync(self, *, failing: bool = False) -> None:
        """Make what the conversation committed durable (no-op without a store).

        Shielded: a write is atomic in the store, so it is never abandoned half-way by a
        cancellation (which would leave this session's version behind the store's); it is
        bounded by ``max(grace_period, 5)`` seconds (every store call answers the bound at
        once), then fails with :class:`~tinyctx.stores.WriteOutcomeUnknown` (the write may
        have landed) and what it held stays pending for the next write, which finds out
        whether it had. ``failing``: another error is already
        leaving, so a failed write is reported as
        :class:`~tinyctx.durable.ThreadWriteFailed` instead of raised over it.
        """
        link = self._link
        if link is None:
            return
        limit = max(self._grace, 5.0)
        try:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(limit) as scope:
                    # one write at a time: a layer's ctx.commit() may come from a task
                    # beside the run (each write goes from the version the last one made)
                    assert self._writing is not None
                    async with self._writing:
                        await link.sync(self._base.conversation)
                if scope.cancelled_caught:
                    raise WriteOutcomeUnknown(
                        link.thread_id, expected_version=link.version, seconds=limit
                    )
        except Exception as exc:
            if not failing:
                raise
            from .durable import ThreadWriteFailed

            self._base.emit(ThreadWriteFailed, error=f"{type(exc).__name__}: {exc}")

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

    async def _ready(self) -> None:
        """Wait for the run of a stream closed early to wind down (it was cancelled)."""
        winding = self._winding
        if winding is not None:
            await winding.wait()
            if self._winding is winding:
                self._winding = None

    def _enter_run(self) -> None:
        if self._group is None or self._closed:
            raise RuntimeError("use the session inside `async with Session(...) as session:`")
        if self._busy:
            raise SessionBusy("this session is already running; runs of one session are sequential")
        self._busy = True

    async def run(self, input: str | Message | Sequence[Message] | None) -> RunResult:
        """Add ``input`` (text, a message or messages) and run until the run ends.

        Input that would break the pairing rule (a result answering no call, a call left
        without its result, a call id the thread used already) raises ``PairingError``
        naming ``input[i]`` and the id, before anything is appended; with a store, input
        the store cannot keep (metadata that is not JSON) raises ``CodecError`` naming
        ``input[i]`` and the field, before anything is appended too. Text from outside
        (input, model output, tool results) enters history valid: lone surrogates become
        U+FFFD; a call id the model reuses is renamed (``renamed_ids`` in the metadata)."""
        await self._ready()
        self._enter_run()
        try:
            messages = _input_messages(input)
            _check_input(
                self._base.conversation.messages,
                messages,
                self._call_ids(),
                # a pause's (or a dead worker's) pending calls are answered before the input
                paused=self._paused is not None or bool(self._abandoned),
            )
            if self._link is not None:
                # what the store cannot keep (metadata that is not JSON, a Message type the
                # codec does not know) is refused here, not found by the next write: once in
                # the conversation it would fail every write of the session
                from .codec import encode_messages

                encode_messages(messages, path="input")
            if self._paused is not None:
                _refuse_engine_thread(self._base, self._link.owner if self._link else None)
                await self._abandon_pause()
            if self._abandoned:
                await self._close_abandoned()
            ctx = self._base._for_run()
            state = _RunState(ctx, usage_before=Usage())
            return await self._drive(state, "before_model", (), input=messages, resumed=False)
        finally:
            self._busy = False

    async def recover(self, mode: Literal["continue", "close"]) -> RunResult | None:
        """Finish the step a dead worker left open (see :attr:`abandoned`).

        ``"continue"`` runs the unanswered tool calls and goes on as a new run (returns
        its result; the dead run's per-run counts are gone with it). ``"close"`` answers
        them with a result saying the worker stopped while they were due, so the model
        knows they may or may not have run (returns None). Either way pairing holds and
        the thread is written. A later ``run()`` closes an abandoned step by itself.

        A thread whose run a durable-engine workflow owns (:mod:`tinyctx.engines`) is
        refused with :class:`SessionBusy`: the engine finishes it when it restarts, and a
        recover here would run its calls a second time.
        """
        if mode not in ("continue", "close"):
            raise ConfigError("mode", mode, "'continue' or 'close'", owner="Session.recover")
        await self._ready()
        self._enter_run()
        try:
            calls = self._abandoned
            if not calls:
                raise InvalidCheckpoint(
                    f"thread {self._base.thread_id!r} has no abandoned step to recover"
                )
            _refuse_engine_thread(self._base)
            if mode == "close":
                await self._close_abandoned()
                await self._sync()
                return None
            ctx = self._base._for_run()
            state = _RunState(ctx, usage_before=Usage())
            return await self._drive(state, "tools", calls, input=None, resumed=False)
        finally:
            self._busy = False

    async def _close_abandoned(self) -> None:
        ctx = self._base
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_CRASH, reason="abandoned")
        for result in results:
            await ctx.conversation.append(result)
        ids = tuple(r.tool_call_id for r in results)
        if results:
            ctx.emit(
                PendingCallsAnswered, reason="the worker running them stopped", tool_call_ids=ids
            )
        from .durable import AbandonedStepClosed

        ctx.emit(AbandonedStepClosed, mode="close", tool_call_ids=ids)
        self._abandoned = ()

    async def resume(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        input: str | Message | Sequence[Message] | None = None,
    ) -> RunResult:
        """Continue an interrupted run from its checkpoint (same run id, same counters).

        Without ``checkpoint`` the session's paused run is resumed (the one a store loaded,
        or this session's own last interrupt). The checkpoint is checked first
        (:meth:`Checkpoint.check`), and it must be the pause the session (or its stored
        thread) is on, or be given to a fresh session without a store: one the thread went
        on from (resumed or abandoned already) raises ``InvalidCheckpoint``, so an approval
        never runs its calls twice. ``decisions`` (one per call id, e.g.
        ``{"call_1": Approve()}``) reach the layers' ``on_resume`` hooks before anything
        runs; a refused input raises :class:`~tinyctx.ResumeError`. A resume that fails
        before the run goes on (refused decisions, a run-start hook raised, the caller
        cancelled) leaves the session paused on the same checkpoint.

        ``input`` (text, a message or messages, as :meth:`run` takes) is the user's new
        message: it is added after the decided calls' results, in the same write as the
        last of them (a crash never stores the answered calls without it), and the model
        then sees both. Input that would break the pairing rule raises ``PairingError``
        naming ``input[i]`` before anything runs. If the resumed calls pause the run again,
        the input is not added (pass it to that resume).
        """
        given = _checked_resume_args("resume", checkpoint, decisions)
        messages = _input_messages(input)
        await self._ready()
        self._enter_run()
        try:
            checkpoint = self._resumable(checkpoint)
            _refuse_engine_thread(self._base, self._link.owner if self._link else None)
            self._check_resume_input(checkpoint, messages)
            ctx, resumed_call = await self._take_decisions(checkpoint, given)
            if self._paused is not checkpoint:
                # a checkpoint from elsewhere (persisted, another session): restore its history
                self._base.conversation.replace(checkpoint.messages, emit_new=False)
                self._paused = checkpoint
            state = _RunState(ctx, usage_before=checkpoint.usage)
            state.added.extend(checkpoint.added)
            state.model_calls = checkpoint.model_calls
            state.tool_calls = checkpoint.tool_calls
            state.resuming = checkpoint
            state.resumed_call = resumed_call
            if checkpoint.phase == "tools":
                state.input_after_tools = messages  # after the decided calls' results
                messages = ()
            return await self._drive(
                state, checkpoint.phase, checkpoint.pending, input=messages, resumed=True
            )
        finally:
            self._busy = False

    def _check_resume_input(self, checkpoint: Checkpoint, messages: tuple[Message, ...]) -> None:
        """``PairingError`` (or ``CodecError``) for resume input that could not follow the
        paused run's answered calls; nothing changes."""
        if not messages:
            return
        used = self._call_ids() | call_ids(checkpoint.messages)
        _check_input(checkpoint.messages, messages, used, paused=True)
        if self._link is not None:
            from .codec import encode_messages

            encode_messages(messages, path="input")

    async def check_resume(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        input: str | Message | Sequence[Message] | None = None,
    ) -> None:
        """Raise what :meth:`resume` would raise before running anything (a checkpoint it
        refuses, ``ResumeError`` for decisions it refuses), and change nothing: a review UI
        checks a reviewer's decisions before it stores or posts them. The layers'
        ``on_resume`` hooks run on a copy of the run's state that is then dropped."""
        given = _checked_resume_args("check_resume", checkpoint, decisions)
        messages = _input_messages(input)
        await self._ready()
        self._enter_run()
        try:
            checkpoint = self._resumable(checkpoint)
            self._check_resume_input(checkpoint, messages)
            ctx, _ = await self._take_decisions(checkpoint, given)
            ctx.run_states.pop(ctx.run_id)
        finally:
            self._busy = False

    def _resumable(self, checkpoint: Checkpoint | None) -> Checkpoint:
        """The checkpoint a resume continues: the given one if this session may resume it,
        else the paused run."""
        if checkpoint is None:
            checkpoint = self._paused
            if checkpoint is None:
                raise InvalidCheckpoint(
                    f"thread {self._base.thread_id!r} has no paused run to resume"
                )
        if checkpoint.thread_id != self._base.thread_id:
            raise ValueError(
                f"checkpoint belongs to thread {checkpoint.thread_id!r}, this session is "
                f"thread {self._base.thread_id!r}"
            )
        checkpoint.check()
        if checkpoint is not self._paused:
            return self._check_resumable(checkpoint)
        return checkpoint

    async def _take_decisions(
        self, checkpoint: Checkpoint, given: FrozenDict[str, Decision]
    ) -> tuple[RunContext[Data], tuple[str, Resumption] | None]:
        """The resumed run's context, its state loaded from the checkpoint and the decisions
        handed to the layers' ``on_resume`` hooks and to a suspended call's tool; on a
        refusal the run's state is dropped (the checkpoint still holds it)."""
        ctx = self._base._for_run(checkpoint.run_config)
        ctx.run_states.load(ctx.run_id, checkpoint.state)
        taken = False
        try:
            for layer in self.agent.resume_hooks:
                taken = bool(await layer.on_resume(ctx, checkpoint, given)) or taken
            resumed_call = await _take_suspension(ctx, checkpoint, given)
            if given and not taken and resumed_call is None:
                raise ResumeError(
                    [
                        f"decisions were given for {sorted(given)}, but no layer takes "
                        f"decisions for the pause at node {checkpoint.node!r}"
                    ]
                )
        except BaseException:
            ctx.run_states.pop(ctx.run_id)  # the checkpoint still holds the run's state
            raise
        return ctx, resumed_call

    def _check_resumable(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint a resume given ``checkpoint`` continues.

        It must be the pause this session (or its stored thread) is on, or come to a fresh
        in-memory session: resuming one the conversation moved on from would roll the
        thread back to the pause and run the approved calls a second time (a
        double-clicked approval, a stale review page). The pause the session holds is the
        authority: a copy of it that differs in any field (a client that edited the run
        config, the layers' counters, the node or the payload) is a ResumeError, and the
        resume continues the session's own checkpoint."""
        paused = self._paused
        thread = self._base.thread_id
        if paused is not None:
            if not _same_pause(checkpoint, paused):
                raise InvalidCheckpoint(
                    f"thread {thread!r} is paused on another run ({_pause_label(paused)}), "
                    f"not on this checkpoint ({_pause_label(checkpoint)}); resume() with no "
                    "checkpoint resumes the run it is paused on"
                )
            _check_unedited(checkpoint, paused, stored=self._link is not None)
            return paused
        history = self._base.conversation.messages
        if self._link is None and (not history or history == checkpoint.messages):
            return checkpoint  # a fresh session takes a checkpoint from elsewhere
        raise InvalidCheckpoint(
            f"thread {thread!r} is not paused on this checkpoint ({_pause_label(checkpoint)}): "
            "its run was resumed or abandoned already, and the thread went on "
            f"({len(history)} messages, the checkpoint has {len(checkpoint.messages)})"
        )

    async def _abandon_pause(self) -> None:
        ctx = self._base
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_ABANDON, reason="abandoned")
        for result in results:
            await ctx.conversation.append(result)
        if results:
            ctx.emit(
                PendingCallsAnswered,
                reason="interrupted and not resumed",
                tool_call_ids=tuple(r.tool_call_id for r in results),
            )
        self._paused = None
        if self._link is not None:
            self._link.unpause()

    async def _drive(
        self,
        state: _RunState,
        phase: Phase,
        pending: tuple[ToolCall, ...],
        *,
        input: str | Message | Sequence[Message] | None,
        resumed: bool,
    ) -> RunResult:
        ctx = state.ctx
        self._current = ctx
        root = ctx.root_run_id
        collected = state.events

        def collect(event: Event) -> None:
            if event.root_run_id == root:
                collected.append(event)

        unsubscribe = ctx.events.subscribe(collect)
        result: RunResult | None = None
        error: BaseException | None = None
        used_from, cost_from, calls_from = ctx.usage.total(), ctx.costs.total(), state.model_calls
        try:
            ctx.emit(RunStarted, resumed=resumed, agent=self.agent.name)
            for message in _input_messages(input):
                await self._append(state, message)
            for layer in self.agent.run_start_hooks:
                await layer.on_run_start(ctx)
            if state.resuming is not None:
                # the resume goes on: from here a failure answers the pending calls instead
                state.resuming = None
                self._paused = None
                if self._link is not None:
                    self._link.unpause()  # cleared with the step's first write
            self._abandoned = ()
            if phase == "tools":
                if resumed:
                    pending = _as_in_history(state, pending)
                await self._run_tools(state, pending)
            while True:
                await self._model_step(state)
        except _Finished as finished:
            result = finished.result
            return result
        except BaseException as exc:
            error = exc
            self._report_end(state, exc)
            raise
        finally:
            self._current = None
            try:
                for layer in self.agent.run_end_hooks:
                    await layer.on_run_end(ctx, result, error)
                paused = None
                if isinstance(error, Interrupted) and error.checkpoint is self._paused:
                    # the run's durable layer state travels with its checkpoint
                    paused = error.checkpoint
                    states = ctx.run_states.pop(ctx.run_id)
                    if states:
                        paused = paused.evolve(state=states.dump())
                        error.checkpoint = self._paused = paused
                else:
                    ctx.run_states.pop(ctx.run_id)
                if result is not None:
                    # a run that ended with an answer leaves no message event queued
                    await ctx.conversation.flush()
                if self._link is not None:
                    # the thread's usage record, written with the run's last write
                    record_run(
                        ctx,
                        ctx.usage.total() - used_from,
                        state.model_calls - calls_from,
                        ctx.costs.total() - cost_from,
                    )
                    if paused is not None:
                        self._link.pause(paused)  # one write: the messages and the pause
                    clean = error is None or paused is not None
                    await self._sync(failing=not clean)
            finally:
                unsubscribe()

    async def _append(
        self, state: _RunState, message: Message, usage: Usage | None = None
    ) -> Message:
        """Append ``message`` with its text made valid (lone surrogates from outside become
        U+FFFD, so no store or encoder fails on it later); returns what was appended."""
        message = valid_message(message)
        await state.ctx.conversation.append(message, usage)
        state.added.append(message)
        return message

    # -- one model step --------------------------------------------------------------------

    async def _model_step(self, state: _RunState) -> None:
        ctx = state.ctx
        agent = self.agent
        await self._checkpoint(state, "before_model")
        limit = ctx.config.max_model_calls
        if limit is not None and state.model_calls >= limit:
            ctx.emit(LimitHit, limit="max_model_calls", value=limit, scope="run")
            raise LimitExceeded("max_model_calls", limit)
        conversation = ctx.conversation
        await conversation.flush()
        request = ModelRequest(
            messages=(),
            tools=ctx.tools.specs(),
            system_prompt=agent.system_prompt,
            model=agent.model_name or ctx.config.model,
            settings=agent.settings,
            server_tools=ctx.tools.server_tools,
        )
        history = conversation.messages
        if type(conversation) is Conversation:
            # a Conversation checked each message as it came in: no O(history) re-check
            object.__setattr__(request, "messages", history)
        else:  # a subclass may answer anything
            request = request.evolve(messages=history)
        started = time.perf_counter()
        undo = agent.request_rule.kernel_request(request)
        try:
            response = await agent.model_onion(request, ctx)
        finally:
            undo()
        if not isinstance(response, ModelResponse):
            raise TypeError(
                f"the model onion returned {type(response).__name__}, expected ModelResponse"
            )
        if ctx.cancellation.is_cancelled():
            # the answer arrived after the cancel: it is dropped, nothing half-added
            await self._cancel(state, "after_model")
        if response.control_only:
            # a layer answered with an outcome instead of calling the model: nothing to add
            control = stronger(response.control, ctx.take_control())
            assert control is not None
            await self._apply(state, control, "after_model", ())
        state.model_calls += 1
        usage = response.usage
        if usage is not None:
            ctx.usage.add(response.model or request.model, usage)
        message = response.message
        if message.tool_calls:
            message = fresh_call_ids(message, self._call_ids())
        ctx.emit(
            ModelCallFinished,
            **ModelCallFinished.fields_of(request, response, time.perf_counter() - started),
        )
        appended = await self._append(state, message, usage)
        assert isinstance(appended, AssistantMessage)
        message = appended
        control = stronger(response.control, ctx.take_control())
        if control is not None:
            await self._apply(state, control, "after_model", message.tool_calls)
        if not message.tool_calls:
            self._finish(state, "completed", message.content)
        await self._run_tools(state, message.tool_calls)

    def _call_ids(self) -> set[str]:
        """Every call id used in the thread's history, kept up to date as it grows (a
        rewritten history is read again)."""
        messages = self._base.conversation.messages
        seen, last, ids = self._ids_seen
        if not (0 < seen <= len(messages) and messages[seen - 1] is last):
            seen, ids = 0, set()
        if seen < len(messages):
            ids |= call_ids(messages[seen:])
        self._ids_seen = (len(messages), messages[-1] if messages else None, ids)
        return ids

    async def _run_tools(self, state: _RunState, calls: tuple[ToolCall, ...]) -> None:
        ctx = state.ctx
        running: ToolCall | None = None
        try:
            for index, call in enumerate(calls):
                await self._checkpoint(state, "before_tool", calls[index:])
                limit = ctx.config.max_tool_calls
                if limit is not None and state.tool_calls >= limit:
                    ctx.emit(LimitHit, limit="max_tool_calls", value=limit, scope="run")
                    raise LimitExceeded("max_tool_calls", limit)
                ctx.emit(
                    ToolCallStarted, tool=call.name, tool_call_id=call.id, arguments=call.arguments
                )
                started = time.perf_counter()
                running = call
                resumed, resuming = state.resumed_call, None
                if resumed is not None and resumed[0] == call.id:
                    state.resumed_call, resuming = None, resumed[1]
                token = _RESUMING.set(resuming)
                try:
                    result = await self.agent.tool_onion(call, ctx)
                except ToolError as exc:
                    # the onion's outer edge: a failure no layer answered reaches the model
                    result = tool_error_result(ctx, call, exc)
                except (Suspend, BaseExceptionGroup) as raised:
                    # a tool that runs its work in a task group (a heartbeat beside a
                    # sub-agent) gets its Suspend back wrapped in a group
                    suspend = _sole_suspension(raised, call)
                    running = None  # no result: the call stays pending, and runs again
                    ctx.emit(
                        ToolCallSuspended,
                        tool=call.name,
                        tool_call_id=call.id,
                        node=suspend.node,
                        seconds=time.perf_counter() - started,
                    )
                    await self._suspend(state, suspend, call, calls[index:])
                finally:
                    _RESUMING.reset(token)
                running = None
                state.tool_calls += 1
                if not isinstance(result, ToolResult) or result.tool_call_id != call.id:
                    raise TinyCtxError(
                        f"the tool onion answered call {call.id!r} with {result!r}; a layer must "
                        "return a ToolResult for the same tool_call_id"
                    )
                await self._append(state, result)
                ctx.emit(
                    ToolCallFinished,
                    tool=call.name,
                    tool_call_id=call.id,
                    is_error=result.is_error,
                    seconds=time.perf_counter() - started,
                )
        except (Interrupted, _Finished):
            raise
        except BaseException as exc:
            # whatever failed, no call is left without a result (queued: no awaiting here);
            # the one that had started may have had effects, so it is not said to have not run
            why = f"the run ended with {type(exc).__name__}"
            self._answer_pending_now(
                state, f"[not run: {why}]", running, f"[interrupted while running: {why}]"
            )
            raise
        if state.input_after_tools:
            added, state.input_after_tools = state.input_after_tools, ()
            for message in added:
                await self._append(state, message)
        await self._checkpoint(state, "after_tools")

    async def _suspend(
        self, state: _RunState, suspend: Suspend, call: ToolCall, pending: tuple[ToolCall, ...]
    ) -> None:
        """Pause the run at ``call``, which a tool suspended: it and ``pending``'s later
        calls stay open, and the run's state remembers the call and what it resumes with."""
        ctx = state.ctx
        record = ctx.run_state(_SUSPENDED, _Suspended)
        record.call_id, record.tool, record.state = call.id, call.name, suspend.state
        ctx.take_control()  # a pause outranks whatever was requested meanwhile
        await self._apply(state, suspend.interrupt, "in_tool", pending)

    # -- checkpoints and control ----------------------------------------------------------

    async def _checkpoint(
        self, state: _RunState, name: str, pending: tuple[ToolCall, ...] = ()
    ) -> None:
        ctx = state.ctx
        if self._link is not None:
            await self._sync()
        if ctx.cancellation.is_cancelled():
            await self._cancel(state, name)
        control = ctx.take_control()
        if control is not None:
            await self._apply(state, control, name, pending)
        await anyio.lowlevel.checkpoint()

    async def _cancel(self, state: _RunState, checkpoint: str) -> None:
        ctx = state.ctx
        token = ctx.cancellation
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_CANCEL, reason="cancelled")
        for result in results:
            await self._append(state, result)
        ctx.emit(Cancelled, checkpoint=checkpoint, reason=token.reason)
        state.cancel_reported = True
        raise RunCancelled(checkpoint, token.reason)

    def _report_end(self, state: _RunState, exc: BaseException) -> None:
        """Every run's trace closes: a run.finished event however it ended, and a
        run.cancelled one when a handler (a stream, a tool) raised the cancellation."""
        if isinstance(exc, Interrupted):
            return  # reported where the interrupt was applied
        ctx = state.ctx
        cancelled = isinstance(exc, (RunCancelled, anyio.get_cancelled_exc_class()))
        if isinstance(exc, RunCancelled) and not state.cancel_reported:
            ctx.emit(Cancelled, checkpoint=exc.checkpoint or "in_call", reason=exc.reason)
        ctx.emit(
            RunFinished,
            status="cancelled" if cancelled else "failed",
            model_calls=state.model_calls,
            tool_calls=state.tool_calls,
            error=f"{type(exc).__name__}: {exc}",
        )

    async def _apply(
        self,
        state: _RunState,
        control: Control,
        checkpoint: str,
        pending: tuple[ToolCall, ...],
    ) -> None:
        ctx = state.ctx
        if isinstance(control, Interrupt):
            calls = pending or pending_tool_calls(ctx.conversation.messages)
            ctx.emit(ControlApplied, control=control.kind, detail=control.detail)
            paused = Checkpoint(
                run_config=ctx.config,
                phase="tools" if calls else "before_model",
                pending=calls,
                node=control.node,
                message=control.message,
                messages=ctx.conversation.messages,
                added=tuple(state.added),
                model_calls=state.model_calls,
                tool_calls=state.tool_calls,
                usage=state.usage(),
                payload=control.payload,
            )
            for layer in self.agent.checkpoint_hooks:
                redacted = layer.on_checkpoint(paused, ctx)
                if not isinstance(redacted, Checkpoint):
                    raise TypeError(
                        f"{layer!r}.on_checkpoint returned {type(redacted).__name__}, "
                        "expected a Checkpoint"
                    )
                paused = redacted
            self._paused = paused
            ctx.emit(
                RunFinished,
                status="interrupted",
                model_calls=state.model_calls,
                tool_calls=state.tool_calls,
            )
            raise Interrupted(control.node, control.message, paused)
        assert isinstance(control, StopWithFinal)
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_STOP, reason="stopped")
        for result in results:
            await self._append(state, result)
        await self._append(
            state,
            AssistantMessage(control.text, metadata={"tinyctx": {"control": control.kind}}),
        )
        ctx.emit(ControlApplied, control=control.kind, detail=control.detail)
        self._finish(state, "stopped", control.text)

    def _answer_pending_now(
        self,
        state: _RunState,
        content: str,
        running: ToolCall | None = None,
        running_content: str = "",
    ) -> None:
        ctx = state.ctx
        results = answer_pending(ctx.conversation.messages, content, reason="failed")
        if running is not None:
            meta = {"tinyctx": {"synthetic": "interrupted"}}
            interrupted = ToolResult.for_call(
                running, running_content, is_error=True, metadata=meta
            )
            results = tuple(interrupted if r.tool_call_id == running.id else r for r in results)
        for result in results:
            ctx.conversation.add(result)
            state.added.append(result)
        if results:
            ctx.emit(
                PendingCallsAnswered,
                reason=content,
                tool_call_ids=tuple(r.tool_call_id for r in results),
            )

    def _finish(self, state: _RunState, status: RunStatus, text: str) -> None:
        ctx = state.ctx
        ctx.emit(
            RunFinished, status=status, model_calls=state.model_calls, tool_calls=state.tool_calls
        )
        raise _Finished(
            RunResult(
                final_text=text,
                messages=tuple(state.added),
                usage=state.usage(),
                status=status,
                run_id=ctx.run_id,
                thread_id=ctx.thread_id,
                model_calls=state.model_calls,
                tool_calls=state.tool_calls,
                events=tuple(state.events),
            )
        )


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


ENGINE_STATE = "tinyctx.engine"
"""The per-thread state a durable-engine workflow keeps while it owns the thread's run."""


def _refuse_engine_thread(ctx: RunContext[Any], owner: str | None = None) -> None:
    """SessionBusy when a workflow other than ``owner``'s owns the thread's run."""
    states = ctx.conversation.layer_state
    if ENGINE_STATE not in states:
        return
    mark = states.dump(check=False).get(ENGINE_STATE)
    workflow = mark.get("workflow_id") if isinstance(mark, Mapping) else None
    if owner is not None and isinstance(mark, Mapping) and mark.get("owner") == owner:
        return  # the workflow's own session
    raise SessionBusy(
        f"thread {ctx.thread_id!r} is run by the durable workflow {workflow!r}: its engine "
        "finishes the run when it restarts, and its pause's decisions go to that workflow "
        "(the engine's decide); recovering, resuming or running it here would run its calls "
        "a second time or mix the two approval modes on one thread"
    )


def _check_input(
    history: tuple[Message, ...],
    messages: tuple[Message, ...],
    used: set[str],
    *,
    paused: bool,
) -> None:
    """The history after ``messages`` are added must keep the pairing rule with no call left
    unanswered (the model is called next): else a PairingError naming ``input[i]`` and the
    id, raised before anything is appended. A pause's pending calls are about to be answered
    as abandoned, so they count as answered.

    The history before its last assistant message is paired already (the loop and
    ``Conversation.replace`` keep it so), so only that tail is checked with the input, and
    the input's call ids against ``used``, the ids of the whole history: the cost grows
    with the input, not with the thread.
    """
    start = len(history)
    while start > 0 and not isinstance(history[start - 1], AssistantMessage):
        start -= 1
    start = max(start - 1, 0)
    tail = history[start:]
    if not messages and not pending_tool_calls(tail):
        return
    answered = answer_pending(tail, SKIPPED_ON_ABANDON) if paused else ()
    older = used - call_ids(tail)
    offset = len(tail) + len(answered)
    try:
        for index, message in enumerate(messages):
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    if call.id in older:
                        raise PairingError(
                            f"duplicate tool call id {call.id!r} at index {offset + index}: "
                            "the thread used it already",
                            index=offset + index,
                            tool_call_id=call.id,
                        )
        check_pairing((*tail, *answered, *messages), allow_pending=False)
    except PairingError as exc:
        index = exc.index - offset
        if index < 0:
            raise PairingError(
                f"history[{start + exc.index}]: {exc}",
                index=start + exc.index,
                tool_call_id=exc.tool_call_id,
            ) from None
        raise PairingError(
            f"input[{index}]: {exc}", index=index, tool_call_id=exc.tool_call_id
        ) from None


def _as_in_history(state: _RunState, pending: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """The pending calls as the history shows them now.

    A resume hook may rewrite the paused calls' arguments in history before they run (an
    approval layer applying a reviewer's edit); the run then runs, and reports in
    ``RunResult.messages``, exactly what the history shows.
    """
    if not pending:
        return pending
    first = pending[0].id
    message = _holder(state.ctx.conversation.messages, first)
    if message is None:
        return pending
    current = {c.id: c for c in message.tool_calls}
    updated = tuple(current.get(c.id, c) for c in pending)
    if updated != pending:
        added = state.added
        for at in range(len(added) - 1, -1, -1):
            old = added[at]
            if isinstance(old, AssistantMessage) and any(c.id == first for c in old.tool_calls):
                added[at] = message
                break
    return updated


def _holder(messages: Sequence[Message], call_id: str) -> AssistantMessage | None:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage) and any(
            c.id == call_id for c in message.tool_calls
        ):
            return message
    return None


def _same_pause(a: Checkpoint, b: Checkpoint) -> bool:
    """Whether two checkpoints are the same pause (one may be a decoded copy of the other,
    or a redacted one): the same run, at the same point, waiting on the same calls, over
    the same history (compared last: a copy's messages are equal, not identical)."""
    return a is b or (
        a.run_id == b.run_id
        and a.phase == b.phase
        and a.model_calls == b.model_calls
        and a.tool_calls == b.tool_calls
        and [c.id for c in a.pending] == [c.id for c in b.pending]
        and a.messages == b.messages
    )


def _check_unedited(given: Checkpoint, paused: Checkpoint, *, stored: bool) -> None:
    """``given`` must equal the pause the session holds in every field (with a store, as
    the documents the store keeps too, so a value edited to another JSON type of equal
    Python value, ``1`` for ``True``, is caught as well); else a ResumeError naming the
    fields that differ. Nothing has run."""
    names = [f.name for f in attrs.fields(Checkpoint)]
    edited = [name for name in names if getattr(given, name) != getattr(paused, name)]
    if not edited and stored:
        from .codec import CodecError, encode_checkpoint

        try:
            same = encode_checkpoint(given) == encode_checkpoint(paused)
        except CodecError as exc:
            raise ResumeError(
                [f"the checkpoint given cannot be stored as the thread's checkpoint is: {exc}"]
            ) from None
        if not same:
            edited = ["the stored document"]
    if edited:
        where = "the stored checkpoint" if stored else "the checkpoint this session holds"
        raise ResumeError(
            [
                f"the checkpoint given differs from {where} of run {paused.run_id!r} in "
                f"{', '.join(edited)}; resume() with no checkpoint resumes the pause as it "
                "was stored (hand a client the thread id, not the checkpoint document)"
            ]
        )


_SUSPENDED = "tinyctx:suspended"
"""The run-state name under which a run remembers the call a tool suspended."""


def _sole_suspension(raised: BaseException, call: ToolCall) -> Suspend:
    """The Suspend a tool call raised, alone or as the only thing in (nested) exception
    groups; anything else is raised again as it is."""
    if isinstance(raised, Suspend):
        return raised
    assert isinstance(raised, BaseExceptionGroup)
    suspensions, rest = raised.split(Suspend)
    if suspensions is None or rest is not None:
        raise raised
    found: list[Suspend] = []
    groups: list[BaseExceptionGroup[Suspend]] = [suspensions]
    while groups:
        for inner in groups.pop().exceptions:
            if isinstance(inner, BaseExceptionGroup):
                groups.append(inner)
            else:
                found.append(inner)
    if len(found) > 1:
        nodes = ", ".join(repr(s.node) for s in found)
        raise TinyCtxError(
            f"tool call {call.id!r} ({call.name}) suspended {len(found)} times at once "
            f"(nodes {nodes}): a call pauses at one node, so run work that may pause in "
            "separate tool calls"
        ) from raised
    return found[0]


class _Suspended:
    """The call a run paused at (:class:`Suspend`): its id, its tool and the tool's state."""

    __slots__ = ("call_id", "state", "tool")

    def __init__(self, call_id: str = "", tool: str = "", state: Any = None) -> None:
        self.call_id = call_id
        self.tool = tool
        self.state = state

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool": self.tool, "state": thaw(self.state)}

    @classmethod
    def from_json(cls, data: Any) -> _Suspended:
        if not isinstance(data, Mapping) or set(data) != {"call_id", "tool", "state"}:
            raise ValueError("expected an object with call_id, tool and state")
        call_id, tool = data["call_id"], data["tool"]
        if not isinstance(call_id, str) or not call_id or not isinstance(tool, str) or not tool:
            raise ValueError("call_id and tool must be non-empty strings")
        return cls(call_id, tool, freeze(data["state"]))


async def _take_suspension(
    ctx: RunContext[Any], checkpoint: Checkpoint, given: FrozenDict[str, Decision]
) -> tuple[str, Resumption] | None:
    """A run paused at a suspended call: its tool checks the decisions (``check_resume``),
    and the call runs again first with them. The record leaves the run's state (a later
    suspension writes its own)."""
    states = ctx.run_states.of(ctx.run_id)
    if _SUSPENDED not in states:
        return None
    record = states.get(_SUSPENDED, _Suspended)
    states.discard(_SUSPENDED)
    if not checkpoint.pending or checkpoint.pending[0].id != record.call_id:
        raise InvalidCheckpoint(
            f"checkpoint of run {checkpoint.run_id!r}: it paused at call {record.call_id!r}, "
            f"which is not its first pending call"
        )
    tool = ctx.tools.get(record.tool)
    if tool is not None:
        await tool.check_resume(record.state, given, ctx)
    elif given:
        raise ResumeError(
            [f"the run paused at a call of tool {record.tool!r}, which this agent does not have"]
        )
    return record.call_id, Resumption(record.state, given)


def _pause_label(checkpoint: Checkpoint) -> str:
    pending = ", ".join(repr(c.id) for c in checkpoint.pending) or "no calls"
    return f"run {checkpoint.run_id!r} at node {checkpoint.node!r}, pending {pending}"


def _checked_resume_args(
    verb: str, checkpoint: Checkpoint | None, decisions: Mapping[str, Decision] | None
) -> FrozenDict[str, Decision]:
    """The decisions of a resume (or its check), its checkpoint's type checked first."""
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"{verb} needs a Checkpoint, got {type(checkpoint).__name__}")
    return _checked_decisions(decisions)


def _checked_decisions(decisions: Mapping[str, Decision] | None) -> FrozenDict[str, Decision]:
    if decisions is None:
        return EMPTY
    if not isinstance(decisions, Mapping):
        raise TypeError(
            f"resume: decisions must be a mapping of call id to decision, got "
            f"{type(decisions).__name__}"
        )
    for call_id, decision in decisions.items():
        if not isinstance(call_id, str):
            raise TypeError(f"resume: decision keys must be call ids (str), got {call_id!r}")
        if not isinstance(decision, DECISION_TYPES):
            raise TypeError(
                f"resume: decisions[{call_id!r}] must be Approve, Edit, Reject or Respond, got "
                f"{type(decision).__name__}"
            )
    return FrozenDict._wrap(dict(decisions))


def _input_messages(input: str | Message | Sequence[Message] | None) -> tuple[Message, ...]:
    if input is None:
        return ()
    if isinstance(input, str):
        return (UserMessage(input),)
    if isinstance(input, Message):
        return (input,)
    messages = tuple(input)
    check_messages(messages, "input")
    return messages
