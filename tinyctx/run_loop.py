"""The loop of one run and its named checkpoints.

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

import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
import anyio.abc

from .agent_core import AgentCore
from .checkpoint import Checkpoint, Phase, RunResult, RunStatus
from .context import RunContext
from .control import RESUMING, Control, Interrupt, StopWithFinal, Suspend, stronger
from .conversation import Conversation
from .durable import ThreadLink, ThreadWriteFailed, take_lock
from .errors import (
    Interrupted,
    LimitExceeded,
    RunCancelled,
    SessionBusy,
    TinyCtxError,
    ToolError,
)
from .events import (
    Cancelled,
    ControlApplied,
    LimitHit,
    ModelCallFinished,
    PendingCallsAnswered,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    ToolCallSuspended,
)
from .frozen import clone_with
from .messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    answer_pending,
    call_ids,
    fresh_call_ids,
    pending_tool_calls,
    valid_message,
)
from .model import ModelRequest, ModelResponse, Usage
from .run_state import RunState
from .store_errors import WriteOutcomeUnknown
from .suspension import SUSPENDED, SuspendedCall, sole_suspension
from .synthetic import SKIPPED_ON_CANCEL, SKIPPED_ON_STOP
from .thread_usage import record_run
from .tool_handler import tool_error_result

__all__ = ["RunLoop"]

Data = TypeVar("Data")


class _Finished(Exception):
    """Internal: unwinds the loop with a result (never escapes the session)."""

    def __init__(self, result: RunResult) -> None:
        self.result = result


class RunLoop(Generic[Data]):
    """The loop of a session's runs: model steps, tool calls, checkpoints and control.

    :class:`~tinyctx.session.Session` sets the state these methods share (in its
    ``__init__``); the resume path (:mod:`tinyctx.resume`) builds on them."""

    agent: AgentCore
    _base: RunContext[Data]
    _grace: float
    _group: anyio.abc.TaskGroup | None
    _busy: bool
    _current: RunContext[Data] | None
    _paused: Checkpoint | None
    _closed: bool
    _ids_seen: tuple[int, Message | None, set[str]]
    _abandoned: tuple[ToolCall, ...]
    _link: ThreadLink | None
    _writing: anyio.Lock | None
    _winding: anyio.Event | None
    _template: ModelRequest | None
    _yield: Callable[[], Awaitable[None]]

    async def _sync(self, *, failing: bool = False, run: RunContext[Data] | None = None) -> None:
        """Make what the conversation committed durable (no-op without a store).

        Shielded: a write is atomic in the store, so it is never abandoned half-way by a
        cancellation (which would leave this session's version behind the store's); it is
        bounded by ``max(grace_period, 5)`` seconds (every store call answers the bound at
        once), then fails with :class:`~tinyctx.stores.WriteOutcomeUnknown` (the write may
        have landed) and what it held stays pending for the next write, which finds out
        whether it had. ``run``: the run it is the last write of (else the one running).
        ``failing``: another error is already
        leaving, so a failed write is reported as
        :class:`~tinyctx.durable.ThreadWriteFailed` instead of raised over it.
        """
        link = self._link
        if link is None:
            return
        # the write is recorded under the run making it (the id its usage is), if any
        run = run if run is not None else self._current
        link.run_id = None if run is None else run.config.agent_run_id or run.config.run_id
        limit = max(self._grace, 5.0)
        try:
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + limit) as scope:
                # one write at a time: a layer's ctx.commit() may come from a task beside
                # the run (each write goes from the version the last one made)
                writing = self._writing
                assert writing is not None
                await take_lock(writing)
                try:
                    await link.sync(self._base.conversation)
                finally:
                    writing.release()
            if scope.cancelled_caught:
                raise WriteOutcomeUnknown(
                    link.thread_id, expected_version=link.version, seconds=limit
                )
        except Exception as exc:
            if not failing:
                raise
            self._base.emit(ThreadWriteFailed, error=f"{type(exc).__name__}: {exc}")

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

    async def _drive(
        self,
        state: RunState,
        phase: Phase,
        pending: tuple[ToolCall, ...],
        *,
        input: tuple[Message, ...],
        resumed: bool,
    ) -> RunResult:
        ctx = state.ctx
        self._current = ctx
        unsubscribe = ctx.events.subscribe(state.events)
        result: RunResult | None = None
        error: BaseException | None = None
        link = self._link
        if link is not None:  # for the thread's usage record
            used_from, cost_from, calls_from = (
                ctx.usage.total(),
                ctx.costs.total(),
                state.model_calls,
            )
        try:
            ctx.emit(RunStarted, resumed=resumed, agent=self.agent.name)
            for message in input:
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
                    pending = state.as_in_history(pending)
                await self._run_tools(state, pending)
            while (result := await self._model_step(state)) is None:
                pass
            return result
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
                    ctx.run_states.pop(ctx.config.run_id)
                if result is not None and ctx.conversation.queued_events:
                    # a run that ended with an answer leaves no message event queued
                    await ctx.conversation.flush()
                if link is not None:
                    # the thread's usage record, written with the run's last write
                    record_run(
                        ctx,
                        ctx.usage.total() - used_from,
                        state.model_calls - calls_from,
                        ctx.costs.total() - cost_from,
                    )
                    if paused is not None:
                        link.pause(paused)  # one write: the messages and the pause
                    clean = error is None or paused is not None
                    await self._sync(failing=not clean, run=ctx)
            finally:
                unsubscribe()

    async def _append(
        self, state: RunState, message: Message, usage: Usage | None = None
    ) -> Message:
        """Append ``message`` with its text made valid (lone surrogates from outside become
        U+FFFD, so no store or encoder fails on it later); returns what was appended."""
        message = valid_message(message)
        await state.ctx.conversation.append(message, usage)
        state.added.append(message)
        return message

    # -- one model step --------------------------------------------------------------------

    async def _model_step(self, state: RunState) -> RunResult | None:
        """One model call and the tool calls it asks for; the run's result when the model
        answered with no tool call (other ends raise)."""
        ctx = state.ctx
        agent = self.agent
        await self._checkpoint(state, "before_model")
        limit = ctx.config.max_model_calls
        if limit is not None and state.model_calls >= limit:
            ctx.emit(LimitHit, limit="max_model_calls", value=limit, scope="run")
            raise LimitExceeded("max_model_calls", limit)
        conversation = ctx.conversation
        if conversation.queued_events:
            await conversation.flush()
        request = self._request(ctx, conversation)
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
        if response.control is not None and response.control_only:
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
        taken = ctx.control.take()  # ctx.take_control(), one call less
        control = response.control if taken is None else stronger(response.control, taken)
        if control is not None:
            await self._apply(state, control, "after_model", message.tool_calls)
        if not message.tool_calls:
            return self._result(state, "completed", message.content)
        await self._run_tools(state, message.tool_calls)
        return None

    def _request(self, ctx: RunContext[Data], conversation: Conversation) -> ModelRequest:
        """The model request for the history now: a copy of the session's last one with
        the new history when the tools, model and settings are the same (they are, but
        for a layer registering tools), else a new one."""
        agent = self.agent
        tools, server_tools = ctx.tools.specs(), ctx.tools.server_tools
        model = agent.model_name or ctx.config.model
        template = self._template
        if template is None or not (
            (template.tools is tools or template.tools == tools)
            and (template.server_tools is server_tools or template.server_tools == server_tools)
            and template.model == model
        ):
            template = self._template = ModelRequest(
                messages=(),
                tools=tools,
                system_prompt=agent.system_prompt,
                model=model,
                settings=agent.settings,
                server_tools=server_tools,
            )
        history = conversation.messages
        if type(conversation) is Conversation:
            # a Conversation checked each message as it came in: no O(history) re-check
            return clone_with(template, {"messages": history})
        return template.evolve(messages=history)  # a subclass may answer anything

    def _call_ids(self) -> set[str]:
        """Every call id used in the thread's history, kept up to date as it grows (a
        rewritten history is read again)."""
        conversation = self._base.conversation  # read in place: no copy of the history
        length = len(conversation)
        seen, last, ids = self._ids_seen
        if not (0 < seen <= length and conversation[seen - 1] is last):
            seen, ids = 0, set()
        if seen < length:
            ids |= call_ids(conversation.since(seen))
        self._ids_seen = (length, conversation[-1] if length else None, ids)
        return ids

    async def _run_tools(self, state: RunState, calls: tuple[ToolCall, ...]) -> None:
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
                token = RESUMING.set(resuming)
                try:
                    result = await self.agent.tool_onion(call, ctx)
                except ToolError as exc:
                    # the onion's outer edge: a failure no layer answered reaches the model
                    result = tool_error_result(ctx, call, exc)
                except (Suspend, BaseExceptionGroup) as raised:
                    # a tool that runs its work in a task group (a heartbeat beside a
                    # sub-agent) gets its Suspend back wrapped in a group
                    suspend = sole_suspension(raised, call)
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
                    RESUMING.reset(token)
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
        self, state: RunState, suspend: Suspend, call: ToolCall, pending: tuple[ToolCall, ...]
    ) -> None:
        """Pause the run at ``call``, which a tool suspended: it and ``pending``'s later
        calls stay open, and the run's state remembers the call and what it resumes with."""
        ctx = state.ctx
        record = ctx.run_state(SUSPENDED, SuspendedCall)
        record.call_id, record.tool, record.state = call.id, call.name, suspend.state
        ctx.take_control()  # a pause outranks whatever was requested meanwhile
        await self._apply(state, suspend.interrupt, "in_tool", pending)

    # -- checkpoints and control ----------------------------------------------------------

    def _checkpoint(
        self, state: RunState, name: str, pending: tuple[ToolCall, ...] = ()
    ) -> Awaitable[None]:
        """A named checkpoint: write what is pending, stop if cancelled, apply a control
        request, and yield (see :meth:`_yield`). With no store, no cancellation and no
        request, the yield itself is what the caller awaits (no frame around it)."""
        ctx = state.ctx
        if self._link is None and not ctx.cancellation.is_cancelled() and not ctx.control.pending:
            return self._yield()
        return self._checkpoint_work(state, name, pending)

    async def _checkpoint_work(
        self, state: RunState, name: str, pending: tuple[ToolCall, ...]
    ) -> None:
        ctx = state.ctx
        if self._link is not None:
            await self._sync()
        if ctx.cancellation.is_cancelled():
            await self._cancel(state, name)
        control = ctx.take_control()
        if control is not None:
            await self._apply(state, control, name, pending)
        await self._yield()  # where a host's cancellation lands; the scheduler's turn, within 1 ms

    async def _cancel(self, state: RunState, checkpoint: str) -> None:
        ctx = state.ctx
        token = ctx.cancellation
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_CANCEL, reason="cancelled")
        for result in results:
            await self._append(state, result)
        ctx.emit(Cancelled, checkpoint=checkpoint, reason=token.reason)
        state.cancel_reported = True
        raise RunCancelled(checkpoint, token.reason)

    def _report_end(self, state: RunState, exc: BaseException) -> None:
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
        state: RunState,
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
        state: RunState,
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

    def _finish(self, state: RunState, status: RunStatus, text: str) -> None:
        raise _Finished(self._result(state, status, text))

    def _result(self, state: RunState, status: RunStatus, text: str) -> RunResult:
        """The run's end with an answer: its run.finished event and its result."""
        ctx = state.ctx
        ctx.emit(
            RunFinished, status=status, model_calls=state.model_calls, tool_calls=state.tool_calls
        )
        config = ctx.config
        return RunResult(
            final_text=text,
            messages=tuple(state.added),
            usage=state.usage(),
            status=status,
            run_id=config.run_id,
            thread_id=config.thread_id,
            model_calls=state.model_calls,
            tool_calls=state.tool_calls,
            events=state.events.snapshot(),
        )
