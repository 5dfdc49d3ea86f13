"""The layer conformance kit: one call checks a layer against every framework rule.

``check_layer(MyLayer())`` drives the layer through real sessions on generated
conversations, on trio and on asyncio, and raises :class:`LayerContractError` naming the
first rule it breaks, with the shrunk example and the doc section that explains the rule.
Call it from a plain (sync) test function; it runs its own event loops.

The rules (names as used in ``skip=``):

``pairing``
    every request that reaches the model keeps each tool call with its results, and the
    conversation the run leaves behind has no orphan;
``no-mutation``
    the request the layer is handed, the messages in it and the parent context are never
    changed in place (a layer builds a new request with ``request.evolve``);
``control-passthrough``
    ``RunCancelled``, ``Interrupted`` and ``LimitExceeded`` raised inside the layer (and
    ``Suspend`` inside a tool hook) reach the caller as the same object, and a response's
    control outcome is never dropped;
``cancellation``
    cancelling the run while the layer awaits ends the call promptly, and once the run's
    token is cancelled the layer calls the rest of the onion no more;
``state-leak``
    nothing of a session is kept on the layer object (an agent is shared by sessions);
``backends``
    every other rule holds on trio and on asyncio (the report names the backend);
``idempotence``
    for a layer declaring ``idempotent = True``: its own output passes through unchanged;
``event-tree``
    the events a run emits form one tree (every parent run exists);
``blocking``
    the layer never blocks the event loop longer than ``block_threshold`` seconds;
``ordering``
    its declared ordering rules are consistent and a stack of it alone is accepted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anyio
import attrs

from ._require import missing_hypothesis

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_hypothesis(__name__) from exc

from ..agent import Agent, Checkpoint, Session
from ..chain import LayerLike, has_hook, layer_name
from ..config import each, integer, one_of, text
from ..context import RunConfig
from ..control import Suspend
from ..errors import ConfigError, Interrupted, LimitExceeded, PairingError, RunCancelled
from ..events import Event, EventSink
from ..messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    UserMessage,
    check_pairing,
)
from ..model import ModelHandler
from ..ordering import check_constraints_consistent, check_ordering
from ..stores import MemoryStore
from ._conformance_probes import (
    _changed_attributes,
    _example,
    _InnerProbe,
    _Options,
    _OuterProbe,
    _Scenario,
    _script,
    _vars_snapshot,
)
from ._fakes import FakeTool, capture_events
from .invariants import assert_events_form_tree
from .strategies import histories

__all__ = ["check_layer", "LayerContractError", "ConformanceReport", "RULES"]

RULES: tuple[str, ...] = (
    "pairing",
    "no-mutation",
    "control-passthrough",
    "cancellation",
    "state-leak",
    "backends",
    "idempotence",
    "event-tree",
    "blocking",
    "ordering",
)

DOC = 'the tinyctx docs, page "Testing your layer"'
"""Where the rules are explained: a page every copy of the docs has (pip users have no
repository path), named by its title; :attr:`LayerContractError.doc` adds the section."""

_WHY = {
    "pairing": "a tool call and its results are one unit: no layer may leave half of one",
    "no-mutation": "values are immutable: change a request with request.evolve(...), and "
    "a message with message.evolve(...), never in place",
    "control-passthrough": "control outcomes and cancellation are the loop's to apply: a "
    "layer must let RunCancelled, Interrupted, LimitExceeded and Suspend through untouched",
    "cancellation": "cancellation is cooperative: a layer must not shield or swallow it, "
    "and must not call the onion again once the run's token is cancelled",
    "state-leak": "an agent is shared by sessions: per-session state belongs in "
    "ctx.state_for(self, factory), never on self",
    "idempotence": "the layer declares idempotent = True, so its own output must pass "
    "through it unchanged",
    "event-tree": "every event's parent run must exist (derive contexts with ctx.derive)",
    "blocking": "an async layer must not block the event loop: use anyio.to_thread for "
    "blocking work, anyio.sleep instead of time.sleep",
    "ordering": "a layer's declared ordering rules must be satisfiable",
}

_TOOL_NAMES = ("lookup", "fetch_page")
_HOOKS: tuple[Literal["model"], Literal["tool"]] = ("model", "tool")


class LayerContractError(AssertionError):
    """A layer broke a framework rule; ``rule`` names it, ``doc`` links its explanation."""

    def __init__(
        self, layer: str, rule: str, detail: str, *, example: str = "", backend: str = ""
    ) -> None:
        self.layer = layer
        self.rule = rule
        self.detail = detail
        self.example = example
        self.backend = backend
        self.doc = f'{DOC}, section "Rule: {rule}"'
        on = f" on {backend}" if backend else ""
        lines = [f"layer {layer!r} breaks rule {rule!r}{on}: {detail}", f"why: {_WHY[rule]}"]
        if example:
            lines.append(f"example: {example}")
        lines.append(f"see: {self.doc}")
        super().__init__("\n".join(lines))


@attrs.frozen
class ConformanceReport:
    """What :func:`check_layer` checked: rules, skipped rules with reasons, examples, hooks."""

    layer: str
    checked: tuple[str, ...]
    skipped: Mapping[str, str]
    examples: int
    hooks: tuple[str, ...]


# ---------------------------------------------------------------------------------------
# probes around the layer under test


class _Kit:
    def __init__(self, options: _Options) -> None:
        self.o = options

    def fail(self, rule: str, detail: str, example: str = "", backend: str = "") -> None:
        if rule in self.o.skip:
            return
        raise LayerContractError(self.o.name, rule, detail, example=example, backend=backend)

    def agent(self, scenario: _Scenario, model: ModelHandler) -> Agent:
        tools = [FakeTool(name, returns=f"{name} result").tool for name in _TOOL_NAMES]
        stack = [_OuterProbe(scenario), self.o.layer, _InnerProbe(scenario)]
        return Agent(model, tools=tools, middleware=stack)

    def session(self, agent: Agent) -> Session[Any]:
        options = dict(self.o.session_options)
        options.setdefault("stores", {"memory": MemoryStore()})
        options.setdefault("events", EventSink(logger=None))
        return Session(agent, config=self.o.config, **options)

    async def drive(
        self, history: tuple[Message, ...], calls: tuple[ToolCall, ...]
    ) -> tuple[_Scenario, tuple[Message, ...], list[Event], float, bool]:
        """One run through the layer; returns what the probes saw, the longest stall, and
        whether a layer paused the run."""
        scenario = _Scenario(fault_hook="none")
        agent = self.agent(scenario, _script(calls, control=False))
        worst = 0.0
        done = anyio.Event()

        async def heartbeat() -> None:
            nonlocal worst
            last = time.perf_counter()
            while not done.is_set():
                await anyio.sleep(0.005)
                now = time.perf_counter()
                worst = max(worst, now - last)
                last = now

        paused = False
        with capture_events() as events:
            async with anyio.create_task_group() as group:
                group.start_soon(heartbeat)
                try:
                    async with self.session(agent) as session:
                        try:
                            await session.run(history)
                        except Interrupted:
                            # a layer may pause a run on purpose (human review): the paused
                            # calls wait for the resume, the rest must still pair
                            paused = True
                        left = session.conversation_messages
                finally:
                    done.set()
        return scenario, left, list(events), worst, paused

    async def normal_run(
        self, history: tuple[Message, ...], calls: tuple[ToolCall, ...], backend: str, ex: str
    ) -> list[Event]:
        scenario, left, events, worst, paused = await self.drive(history, calls)
        # a busy machine can stall any loop once; a blocking layer stalls it every time
        # (no second look when the blocking rule is skipped: nothing would be reported)
        retries = 0 if "blocking" in self.o.skip else 2
        while worst > self.o.block_threshold and retries:
            retries -= 1
            worst = min(worst, (await self.drive(history, calls))[3])
        if scenario.mutation is not None:
            self.fail("no-mutation", scenario.mutation, ex, backend)
        for i, request in enumerate(scenario.sent):
            try:
                check_pairing(request.messages, allow_pending=False)
            except PairingError as exc:
                self.fail("pairing", f"model request {i}: {exc}", ex, backend)
        try:
            check_pairing(left, allow_pending=paused)
        except PairingError as exc:
            self.fail("pairing", f"the conversation after the run: {exc}", ex, backend)
        if worst > self.o.block_threshold:
            self.fail(
                "blocking",
                f"the event loop was blocked for {worst:.3f} s "
                f"(threshold {self.o.block_threshold:.3f} s)",
                ex,
                backend,
            )
        return events

    async def fault_run(self, scenario: _Scenario, calls: tuple[ToolCall, ...]) -> None:
        agent = self.agent(scenario, _script(calls, control=False))
        with anyio.fail_after(5):
            async with self.session(agent) as session:
                with contextlib.suppress(Exception):  # the kit inspects what escaped the layer
                    await session.run("conformance")

    async def check_passthrough(
        self, calls: tuple[ToolCall, ...], history: tuple[Message, ...], backend: str, ex: str
    ) -> None:
        checkpoint = Checkpoint(
            run_config=self.o.config,
            phase="before_model",
            pending=(),
            node="conformance",
            message="paused by the conformance kit",
            messages=history,
            added=(),
        )
        faults: list[BaseException] = [
            RunCancelled("conformance", "kit"),
            Interrupted("conformance", "kit", checkpoint),
            LimitExceeded("model_calls", 1),
        ]
        for hook in self.o.hooks:
            if hook == "tool" and not calls:
                continue
            # a tool's call suspended (a sub-agent's review): the loop pauses the run at it
            suspend = [Suspend("conformance", "kit", state={"kit": 1})] if hook == "tool" else []
            for fault in (*faults, *suspend):
                scenario = _Scenario(fault=fault, fault_hook=hook)
                await self.fault_run(scenario, calls)
                if not scenario.inner_calls:
                    continue  # the layer answered without calling on: nothing to pass
                if not any(e is fault for e in scenario.escaped):
                    what = [type(e).__name__ for e in scenario.escaped] or ["a normal result"]
                    self.fail(
                        "control-passthrough",
                        f"{type(fault).__name__} raised inside its {hook} hook came out as "
                        f"{', '.join(what)}",
                        ex,
                        backend,
                    )
        # a response's control outcome is never dropped on the way out
        scenario = _Scenario(fault_hook="none")
        agent = self.agent(scenario, _script((), control=True))
        async with self.session(agent) as session:
            await session.run("conformance")
        if scenario.sent and not any(c is not None for c in scenario.returned_control):
            self.fail(
                "control-passthrough",
                "a response carrying StopWithFinal came out with control=None",
                ex,
                backend,
            )

    async def check_cancellation(self, calls: tuple[ToolCall, ...], backend: str, ex: str) -> None:
        for hook in self.o.hooks:
            if hook == "tool" and not calls:
                continue
            # the caller's cancel scope fires while the layer awaits the rest of the onion
            scenario = _Scenario(fault_hook=hook, hang=True)
            agent = self.agent(scenario, _script(calls, control=False))
            escaped = False
            with anyio.move_on_after(3) as guard:
                async with self.session(agent) as session:
                    with anyio.move_on_after(0.05):
                        # a layer that pauses the run on purpose never reaches a later hook
                        with contextlib.suppress(RunCancelled, Interrupted):
                            await session.run("conformance")
                    escaped = True
            if guard.cancelled_caught or not escaped:
                self.fail(
                    "cancellation",
                    f"a cancelled run did not end within 3 s while the {hook} hook awaited",
                    ex,
                    backend,
                )
            if any(
                not isinstance(e, anyio.get_cancelled_exc_class() | RunCancelled)
                for e in scenario.escaped
            ):
                self.fail(
                    "cancellation",
                    f"cancellation inside its {hook} hook came out as "
                    f"{[type(e).__name__ for e in scenario.escaped]}",
                    ex,
                    backend,
                )
            # the run's token cancelled: no further attempt
            scenario = _Scenario(fault_hook=hook, cancel_token=True)
            await self.fault_run(scenario, calls)
            if scenario.inner_calls > 1:
                self.fail(
                    "cancellation",
                    f"it called the rest of the {hook} onion {scenario.inner_calls} times after "
                    "the run's token was cancelled",
                    ex,
                    backend,
                )

    async def check_idempotence(self, history: tuple[Message, ...], backend: str, ex: str) -> None:
        first = _Scenario(fault_hook="none")
        async with self.session(self.agent(first, _script((), control=False))) as session:
            await session.run(history)
        if not first.sent:
            return
        once = first.sent[0].messages
        again = _Scenario(fault_hook="none")
        async with self.session(self.agent(again, _script((), control=False))) as session:
            await session.run(once)
        twice = again.sent[0].messages if again.sent else ()
        if tuple(twice) != tuple(once):
            self.fail(
                "idempotence",
                f"its output of {len(once)} messages became {len(twice)} different messages "
                "when passed through it again",
                ex,
                backend,
            )

    async def fixed(
        self, history: tuple[Message, ...], calls: tuple[ToolCall, ...], backend: str
    ) -> None:
        """The rules that need no generated data, on one small conversation (fast to fail)."""
        ex = _example(history, calls)
        before = _vars_snapshot(self.o.layer)
        events = await self.normal_run(history, calls, backend, ex)
        self.check_tree(events, backend, ex)
        await self.check_passthrough(calls, history, backend, ex)
        await self.check_cancellation(calls, backend, ex)
        self.check_leak(before, backend, ex)

    async def generated(
        self, history: tuple[Message, ...], calls: tuple[ToolCall, ...], backend: str
    ) -> None:
        """The rules whose failures depend on the conversation: shrunk by hypothesis."""
        ex = _example(history, calls)
        before = _vars_snapshot(self.o.layer)
        events = await self.normal_run(history, calls, backend, ex)
        self.check_tree(events, backend, ex)
        if getattr(self.o.layer, "idempotent", False):
            await self.check_idempotence(history, backend, ex)
        self.check_leak(before, backend, ex)

    def check_tree(self, events: list[Event], backend: str, ex: str) -> None:
        try:
            assert_events_form_tree(events)
        except AssertionError as exc:
            self.fail("event-tree", str(exc), ex, backend)

    def check_leak(self, before: Mapping[str, Any], backend: str, ex: str) -> None:
        changed = _changed_attributes(before, self.o.layer)
        if changed:
            self.fail(
                "state-leak",
                "attributes of the layer changed during runs: " + "; ".join(changed),
                ex,
                backend,
            )


def _check_ordering(kit: _Kit) -> None:
    layer = kit.o.layer
    problems = check_constraints_consistent(layer)
    if problems:
        kit.fail("ordering", "; ".join(problems))
    try:
        check_ordering([layer])
    except ConfigError as exc:
        kit.fail("ordering", f"a stack of the layer alone is refused: {exc}")


_CALL_LISTS = st.lists(
    st.tuples(st.sampled_from(_TOOL_NAMES), st.sampled_from([{}, {"q": "x"}, {"n": 2}])),
    max_size=3,
)


_RULE_NAMES = each(one_of(RULES), allowed=f"rule names, each one of {', '.join(RULES)}")
_REASON = text(blank=False, allowed="a non-empty reason")
_HOOK_NAMES = each(one_of(("model", "tool")), allowed="'model' and/or 'tool'")
_BACKENDS = each(one_of(("trio", "asyncio")), empty=False, allowed="'trio' and/or 'asyncio'")


def _arguments(
    layer: LayerLike,
    hooks: Sequence[str] | None,
    skip: Mapping[str, str] | None,
    max_examples: int,
    backends: Sequence[str],
) -> tuple[dict[str, str], tuple[str, ...], Sequence[str]]:
    """check_layer's arguments checked: the skipped rules, the hooks and the backends."""
    skip = dict(skip or {})
    _RULE_NAMES.check(skip.keys(), "skip", "check_layer")
    for rule, reason in skip.items():
        _REASON.check(reason, f"skip[{rule!r}]", "check_layer")
    own_hooks = tuple(h for h in _HOOKS if has_hook(layer, h))
    chosen = tuple(hooks) if hooks is not None else own_hooks
    _HOOK_NAMES.check(chosen, "hooks", "check_layer")
    integer(minimum=1).check(max_examples, "max_examples", "check_layer")
    _BACKENDS.check(backends, "backends", "check_layer")
    if "backends" in skip:
        backends = tuple(backends)[:1]
    return skip, chosen, backends


def check_layer(
    layer: LayerLike,
    *,
    hooks: Sequence[str] | None = None,
    skip: Mapping[str, str] | None = None,
    max_examples: int = 20,
    backends: Sequence[str] = ("trio", "asyncio"),
    config: RunConfig | None = None,
    session_options: Mapping[str, Any] | None = None,
    block_threshold: float = 0.1,
) -> ConformanceReport:
    """Check ``layer`` against every framework rule; raise :class:`LayerContractError`.

    Call it from a sync test: it runs its own event loops.

    Args:
        layer: The layer under test.
        hooks: The onions checked, "model" and/or "tool"; default those it implements.
        skip: Rule names that do not apply, each with the reason.
        max_examples: Generated histories per property rule.
        backends: The async backends every scenario runs on.
        config: The run config of every session; default a 200,000-token window.
        session_options: Keyword arguments for every ``Session``.
        block_threshold: The longest, in seconds, the layer may block the event loop.
    """
    name = layer_name(layer)
    skip, chosen, backends = _arguments(layer, hooks, skip, max_examples, backends)
    options = _Options(
        layer=layer,
        name=name,
        config=config or RunConfig(model="conformance-model", max_tokens=200_000),
        session_options=dict(session_options or {}),
        hooks=chosen,
        skip=skip,
        block_threshold=block_threshold,
    )
    kit = _Kit(options)
    _check_ordering(kit)
    small = (
        UserMessage("find the release notes"),
        AssistantMessage("", tool_calls=(ToolCall("kit_h1", "lookup", {"q": "notes"}),)),
        ToolResult("kit_h1", "notes: v1.2 fixes pairing", "lookup"),
        AssistantMessage("v1.2 fixes pairing."),
        UserMessage("and the one before?"),
    )
    small_calls = (ToolCall("kit_0", "lookup", {"q": "v1.1"}), ToolCall("kit_1", "fetch_page"))
    for backend in backends:
        anyio.run(kit.fixed, small, small_calls, backend, backend=backend)
    counter = {"n": 0}

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(history=histories(max_turns=6), drawn=_CALL_LISTS)
    def run_example(history: tuple[Message, ...], drawn: list[tuple[str, dict[str, Any]]]) -> None:
        counter["n"] += 1
        calls = tuple(ToolCall(f"kit_{i}", n, a) for i, (n, a) in enumerate(drawn))
        for backend in backends:
            anyio.run(kit.generated, history, calls, backend, backend=backend)

    run_example()
    checked = tuple(r for r in RULES if r not in skip)
    if not getattr(layer, "idempotent", False):
        checked = tuple(r for r in checked if r != "idempotence")
    return ConformanceReport(name, checked, skip, counter["n"], chosen)
