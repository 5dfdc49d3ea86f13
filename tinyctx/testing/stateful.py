"""A hypothesis state machine that drives a real Session through your stack of layers.

Subclass :class:`SessionMachine`, return your layers from :meth:`~SessionMachine.middleware`
and expose ``TestCase``::

    class MyStackMachine(SessionMachine):
        def middleware(self):
            return [MyTrimLayer(keep=6), MyRedactor()]

    TestMyStack = MyStackMachine.TestCase

Hypothesis then runs random sequences of user turns, tool turns, usage reports,
cancellations (before the model, mid-stream, in a hung stream, after the model, in a
tool, in a hung tool), control requests (StopWithFinal / Interrupt from a tool or from a
response) and resumes, and after every step checks that

- the conversation keeps every tool call paired with its result (only an interrupted run
  may leave calls pending),
- no request the model received had an orphan call or result,
- the events of every run form one tree rooted at the session,
- usage never decreases,
- nothing of a cancelled model answer or stream was kept.

The Session runs on an event loop in a helper thread (an anyio blocking portal kept open
for the machine's lifetime): it is entered and exited by one task there, each step runs
as its own task, and ``backend`` picks trio (default) or asyncio.

Importing this module imports hypothesis (the ``testing`` extra).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any, ClassVar, TypeVar

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._require import missing_hypothesis

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_hypothesis(__name__) from exc

from ..agent import Agent, Checkpoint, RunResult, Session
from ..chain import Layer, LayerLike
from ..context import RunContext
from ..control import Interrupt, StopWithFinal
from ..errors import Interrupted, RunCancelled
from ..events import Event, EventSink, ModelStreamDelta
from ..messages import Message, ToolCall
from ..model import ModelHandler, ModelRequest, ModelResponse, Usage
from ..tools import Tool
from ._fakes import HANG, FakeTool, ScriptedModel, call, reply, stream
from .invariants import assert_events_form_tree, assert_pairing_intact

__all__ = ["SessionMachine", "ProviderDown"]

T = TypeVar("T")

CANCEL_POINTS = (
    "before_model",
    "mid_stream",
    "hung_stream",
    "after_model",
    "during_tool",
    "hung_tool",
)


def _check(condition: bool, message: str, *args: object) -> None:
    # explicit, so the checks hold under python -O too; formatted only on failure
    if not condition:
        raise AssertionError(message % args if args else message)


class ProviderDown(ConnectionError):
    """The failure the machine's model raises in the ``model_failure`` rule."""


class _RunProbe(Layer):
    """Sees each run's own context when it starts; adds no frame to either onion."""

    name = "tinyctx.testing.run_probe"

    def __init__(self, machine: SessionMachine) -> None:
        self._machine = machine

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        self._machine._run_started(ctx)


class SessionMachine(RuleBasedStateMachine):
    """Drives one Session with any stack of layers and checks the invariants after every step.

    Override :meth:`middleware` (your layers, fresh for every example), and optionally
    :meth:`make_agent` and :meth:`session_options`. Add your own ``@invariant()`` methods for
    what your layers promise; ``self.session``, ``self.model`` (a :class:`ScriptedModel`
    recording every request) and ``self.events`` are there to inspect.

    Class knobs: ``backend`` ("trio" or "asyncio"), ``allowed_errors`` (exception types your
    stack may raise on any run, e.g. ``ContextLimitExceeded``), ``check_outcomes`` (set False
    when your stack legitimately changes what a run returns: then only the invariants are
    checked), ``step_timeout`` (seconds before a stuck step fails instead of hanging).
    """

    backend: ClassVar[str] = "trio"
    backend_options: ClassVar[dict[str, Any] | None] = None
    allowed_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    check_outcomes: ClassVar[bool] = True
    step_timeout: ClassVar[float] = 30.0

    # -- what a subclass overrides -------------------------------------------------------

    def middleware(self) -> Sequence[LayerLike]:
        """The stack under test, outermost first (called once per example)."""
        return ()

    def make_agent(
        self, model: ModelHandler, tools: Sequence[Tool], middleware: Sequence[LayerLike]
    ) -> Agent:
        """The agent under test. Keep ``model``, ``tools`` and ``middleware`` (which holds
        your :meth:`middleware` behind the machine's probe) when you override it."""
        return Agent(
            model=model,
            tools=tools,
            middleware=middleware,
            system_prompt="You are driven by tinyctx.testing.stateful.",
        )

    def session_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`tinyctx.Session` (thread_id, config, data, ...).

        Unless you pass ``ctx`` or ``events``, the session's events are not logged (they
        still reach ``self.events`` and :func:`tinyctx.testing.capture_events`)."""
        return {}

    # -- lifecycle -----------------------------------------------------------------------

    def __init__(self) -> None:
        super().__init__()
        self.plan: deque[Any] = deque()
        self.events: list[Event] = []
        self.checkpoint: Checkpoint | None = None
        self.markers: list[str] = []
        self._counter = itertools.count(1)
        self._unplanned = 0
        self._checked_requests = 0
        self._usage = Usage()
        self._usage_calls = 0
        self._run_ctx: RunContext[Any] | None = None
        self._cancel_at_start = False
        self._cancel_on_delta: int | None = None
        self._tool_action: str | None = None
        self.model = ScriptedModel([self._serve], name="machine", repeat_last=True)
        self.lookup = FakeTool("lookup", returns=self._lookup)
        self.stopper = FakeTool("stop", returns="stopping", control=StopWithFinal("stopped"))
        self.pauser = FakeTool("pause", returns="pausing", control=Interrupt("machine", "pause"))
        tools = [self.lookup.tool, self.stopper.tool, self.pauser.tool]
        agent = self.make_agent(self.model, tools, [_RunProbe(self), *self.middleware()])
        self._stack = ExitStack()
        try:
            portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(
                self.backend, self.backend_options
            )
            self.portal = self._stack.enter_context(portal_cm)
            options = self.session_options()
            if "ctx" not in options:
                options.setdefault("events", EventSink(logger=None))  # quiet, still captured
            session: Session[Any] = Session(agent, **options)
            self.session = self._stack.enter_context(
                self.portal.wrap_async_context_manager(session)
            )
            self.session.ctx.events.subscribe(self._on_event)
        except BaseException:
            self._stack.close()
            raise

    def teardown(self) -> None:
        # leaving the session (its task group) happens in the task that entered it
        self._stack.close()
        assert_events_form_tree(self.events)

    # -- the machine's model, tools and probes (these run on the event loop) ------------

    def _serve(self, request: ModelRequest, ctx: RunContext[Any]) -> Any:
        if self.plan:
            return self.plan.popleft()
        self._unplanned += 1
        return reply(f"(unplanned call {self._unplanned})")

    def _lookup(self, arguments: Any, ctx: RunContext[Any]) -> Any:
        action, self._tool_action = self._tool_action, None
        if action == "cancel":
            self._cancel_run("machine: cancelled in a tool")
        elif action == "hang":
            return HANG
        return f"found {arguments.get('q', '')}"

    def _run_started(self, ctx: RunContext[Any]) -> None:
        self._run_ctx = ctx
        if self._cancel_at_start:
            self._cancel_at_start = False
            ctx.cancellation.cancel("machine: cancelled before the model")

    def _on_event(self, event: Event) -> None:
        self.events.append(event)
        if self._cancel_on_delta is not None and isinstance(event, ModelStreamDelta):
            self._cancel_on_delta -= 1
            if self._cancel_on_delta <= 0:
                self._cancel_on_delta = None
                self._cancel_run("machine: cancelled mid-stream")

    def _cancel_run(self, reason: str) -> None:
        # the current run's own token: the session stays usable for the next run
        if self._run_ctx is None:
            raise RuntimeError("SessionMachine: no run has started, nothing to cancel")
        self._run_ctx.cancellation.cancel(reason)

    # -- driving the session from hypothesis' thread -------------------------------------

    def _guarded(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        timeout = self.step_timeout

        async def run(*args: Any) -> T:
            with anyio.fail_after(timeout):
                return await fn(*args)

        return run

    def _outcome(self, fn: Callable[..., Awaitable[RunResult]], *args: Any) -> Any:
        expected: tuple[type[BaseException], ...] = (RunCancelled, Interrupted, ProviderDown)
        try:
            return self.portal.call(self._guarded(fn), *args)
        except (*expected, *self.allowed_errors) as exc:
            return exc

    def _run(self, text: str) -> Any:
        self.checkpoint = None  # a new run abandons a pause
        return self._settle(self._outcome(self.session.run, text))

    def _settle(self, outcome: Any) -> Any:
        if isinstance(outcome, Interrupted):
            self.checkpoint = outcome.checkpoint
            _check(
                self.session.paused is outcome.checkpoint,
                "Interrupted was raised but the session holds another checkpoint",
            )
        return outcome

    def _expect(
        self, outcome: Any, expected: type[BaseException] | str, *, plan_used: bool = True
    ) -> bool:
        """Check the outcome of a rule's run: a RunResult with status ``expected`` or an
        exception of type ``expected``. Returns whether to check the rule's own details
        (False when ``check_outcomes`` is off or one of ``allowed_errors`` ended the run)."""
        if not self.check_outcomes or isinstance(outcome, self.allowed_errors):
            return False
        if isinstance(expected, str):
            status = outcome.status if isinstance(outcome, RunResult) else None
            _check(status == expected, "expected a run that ends %r, got %r", expected, outcome)
        else:
            _check(isinstance(outcome, expected), "expected %s, got %r", expected.__name__, outcome)
        _check(not plan_used or not self.plan, "the run left planned answers unused: %r", self.plan)
        return True

    def _answer(self, text: str, *calls: ToolCall, streamed: bool, usage: Usage) -> Any:
        response = reply(text, *calls, usage=usage)
        return stream(response, chunk_size=5) if streamed else response

    # -- rules ---------------------------------------------------------------------------

    @rule(text=st.text(max_size=40), streamed=st.booleans())
    def user_turn(self, text: str, streamed: bool) -> None:
        """A user message answered with text (sometimes streamed)."""
        self.plan.clear()
        answer = f"answer {next(self._counter)}"
        self.plan.append(self._answer(answer, streamed=streamed, usage=Usage(10, 3)))
        outcome = self._run(text)
        if self._expect(outcome, "completed"):
            _check(outcome.final_text == answer, f"final text {outcome.final_text!r} != {answer!r}")

    @rule(calls=st.integers(1, 3), streamed=st.booleans())
    def tool_turn(self, calls: int, streamed: bool) -> None:
        """The model calls ``lookup`` (1-3 times in one message), then answers."""
        self.plan.clear()
        n = next(self._counter)
        before = len(self.lookup.calls)
        requested = [call("lookup", id=f"m{n}_{k}", q=f"q{n}.{k}") for k in range(calls)]
        self.plan.append(self._answer("", *requested, streamed=streamed, usage=Usage(20, 5)))
        self.plan.append(self._answer(f"done {n}", streamed=streamed, usage=Usage(30, 4)))
        outcome = self._run(f"look up {n}")
        if self._expect(outcome, "completed"):
            ran = len(self.lookup.calls) - before
            _check(ran == calls, f"{calls} lookup calls requested, {ran} ran")
            _check(outcome.final_text == f"done {n}", f"final text {outcome.final_text!r}")

    @rule(
        input_tokens=st.integers(0, 50_000),
        output_tokens=st.integers(0, 4_000),
        cached=st.integers(0, 50_000),
    )
    def usage_report(self, input_tokens: int, output_tokens: int, cached: int) -> None:
        """A response reports usage; the session's tracker adds exactly that."""
        self.plan.clear()
        usage = Usage(input_tokens, output_tokens, min(cached, input_tokens))
        before = self.session.ctx.usage.total()
        self.plan.append(reply("counted", usage=usage))
        outcome = self._run("how much?")
        if self._expect(outcome, "completed"):
            after = self.session.ctx.usage.total()
            _check(after - before == usage, f"usage went {before} -> {after}, reported {usage}")

    @rule(where=st.sampled_from(CANCEL_POINTS))
    def cancel(self, where: str) -> None:
        """The run's token is cancelled at one point; the run raises RunCancelled, keeps
        nothing partial and leaves no call unanswered; the session stays usable."""
        self.plan.clear()
        n = next(self._counter)
        marker = f"partial-{n}-"
        self.markers.append(marker)
        if where == "before_model":
            self._cancel_at_start = True
            self.plan.append(reply(marker))
        elif where == "mid_stream":
            self._cancel_on_delta = 2
            self.plan.append(stream(marker, "more ", "and more", usage=Usage(5, 5)))
        elif where == "hung_stream":
            self.plan.append(stream(marker, "waiting", HANG, "never"))
        elif where == "after_model":
            self.plan.append(self._cancel_then(reply(marker, usage=Usage(7, 7))))
        elif where in ("during_tool", "hung_tool"):
            self._tool_action = "cancel" if where == "during_tool" else "hang"
            calls = [call("lookup", id=f"m{n}_a", q="a"), call("lookup", id=f"m{n}_b", q="b")]
            self.plan.append(reply("", *calls))
            self.plan.append(reply(marker))
        if where in ("hung_stream", "hung_tool"):
            outcome = self._run_then_cancel(f"cancel {where}")
        else:
            outcome = self._run(f"cancel {where}")
        self._expect(outcome, RunCancelled, plan_used=False)
        self.plan.clear()
        self._cancel_at_start = False
        self._cancel_on_delta = None
        self._tool_action = None

    def _cancel_then(self, response: ModelResponse) -> Any:
        def answer_after_cancel(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            self._cancel_run("machine: cancelled while the model answered")
            return response

        return answer_after_cancel

    def _run_then_cancel(self, text: str) -> Any:
        self.checkpoint = None
        future = self.portal.start_task_soon(self._guarded(self.session.run), text)
        self.portal.call(anyio.wait_all_tasks_blocked)
        self.portal.call(self._cancel_run, "machine: cancelled from outside")
        expected: tuple[type[BaseException], ...] = (RunCancelled,)
        try:
            return future.result()
        except (*expected, *self.allowed_errors) as exc:
            return exc

    @rule(
        kind=st.sampled_from(["stop", "interrupt"]),
        source=st.sampled_from(["tool", "response"]),
    )
    def control_request(self, kind: str, source: str) -> None:
        """A tool or a response asks to stop (the run ends "stopped") or to pause (the run
        raises Interrupted with a checkpoint to resume)."""
        self.plan.clear()
        n = next(self._counter)
        lookup = call("lookup", id=f"m{n}_l", q="later")
        if source == "tool":
            first = call("stop" if kind == "stop" else "pause", id=f"m{n}_c")
            self.plan.append(reply("", first, lookup, usage=Usage(9, 2)))
        else:
            control = StopWithFinal("stopped") if kind == "stop" else Interrupt("machine", "pause")
            self.plan.append(reply("", lookup, usage=Usage(9, 2), control=control))
        outcome = self._run(f"control {kind} from {source}")
        if kind == "stop":
            if self._expect(outcome, "stopped"):
                _check(outcome.final_text == "stopped", f"final text {outcome.final_text!r}")
        elif self._expect(outcome, Interrupted):
            pending = [c.id for c in self.checkpoint.pending] if self.checkpoint else None
            _check(pending == [lookup.id], f"pending calls {pending}, expected {[lookup.id]}")

    @precondition(lambda self: self.checkpoint is not None)
    @rule()
    def resume(self) -> None:
        """An interrupted run resumes: its pending calls run, then the model answers."""
        self.plan.clear()
        checkpoint = self.checkpoint
        if checkpoint is None:  # pragma: no cover - the precondition says otherwise
            return
        n = next(self._counter)
        self.plan.append(reply(f"resumed {n}", usage=Usage(12, 3)))
        self.checkpoint = None
        outcome = self._settle(self._outcome(self.session.resume, checkpoint))
        if self._expect(outcome, "completed"):
            _check(outcome.final_text == f"resumed {n}", f"final text {outcome.final_text!r}")
            _check(self.session.paused is None, "the session is still paused after resume")

    @rule()
    def model_failure(self) -> None:
        """The provider fails: the error reaches the caller, history stays consistent."""
        self.plan.clear()
        self.plan.append(ProviderDown("machine: provider down"))
        outcome = self._run("will fail")
        self._expect(outcome, ProviderDown)
        self.plan.clear()

    # -- invariants, checked after every step --------------------------------------------

    @property
    def conversation(self) -> tuple[Message, ...]:
        return self.session.conversation_messages

    @invariant()
    def conversation_keeps_pairing(self) -> None:
        paused = self.checkpoint is not None
        assert_pairing_intact(self.conversation, allow_pending=paused)

    @invariant()
    def model_never_sees_an_orphan(self) -> None:
        for request in self.model.requests[self._checked_requests :]:
            assert_pairing_intact(request.messages, allow_pending=False)
        self._checked_requests = len(self.model.requests)

    @invariant()
    def events_form_one_tree(self) -> None:
        assert_events_form_tree(self.events)

    @invariant()
    def usage_never_decreases(self) -> None:
        usage, calls = self.session.ctx.usage.total(), self.session.ctx.usage.calls
        before = self._usage
        _check(
            usage.input_tokens >= before.input_tokens
            and usage.output_tokens >= before.output_tokens
            and usage.cached_tokens >= before.cached_tokens
            and calls >= self._usage_calls,
            f"usage decreased: {before} ({self._usage_calls} calls) -> {usage} ({calls} calls)",
        )
        self._usage, self._usage_calls = usage, calls

    @invariant()
    def nothing_partial_is_kept(self) -> None:
        for message in self.conversation:
            for marker in self.markers:
                _check(marker not in message.text, "cancelled output was kept: %r", message)
