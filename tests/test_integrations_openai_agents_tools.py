"""tinyctx's tool layers and review around the OpenAI Agents SDK's own function tools:
wrap_tools runs the tool onion (custom layers, ToolRetry, CallLimits, the result budget)
around each SDK tool, and Approvals holds a call as the SDK's own interruption, approved
or rejected through RunState and resumed, in the SDK's loop with its ScriptedModel."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, RunState, function_tool
from agents.items import ToolApprovalItem
from agents.testing import ScriptedModel, assistant_message, function_call

from tinyctx import Layer, ToolResult
from tinyctx.decisions import Approve, Reject
from tinyctx.events import EventSink
from tinyctx.integrations import Stack, StackInterrupted
from tinyctx.integrations.openai_agents import TinyctxInputFilter, TinyctxModel
from tinyctx.integrations.openai_agents_items import from_agents_items
from tinyctx.integrations.openai_agents_tools import REVIEW_PAYLOAD, wrap_tools
from tinyctx.messages import check_pairing
from tinyctx.middleware import Approvals, CallLimits, ToolResultBudget, ToolRetry
from tinyctx.middleware.approvals import REVIEW_PAYLOAD_TYPE

CONFIG = RunConfig(tracing_disabled=True)


@pytest.fixture
def anyio_backend() -> str:
    """The Agents SDK runs on asyncio only: these tests run there."""
    return "asyncio"


class Ledger:
    """What the SDK tools really did, call by call."""

    def __init__(self, failures: int = 0) -> None:
        self.deleted: list[str] = []
        self.looked_up: list[str] = []
        self.failures = failures

    def tools(self) -> list[Any]:
        @function_tool
        def delete_file(path: str) -> str:
            """Delete a file."""
            self.deleted.append(path)
            return f"deleted {path}"

        @function_tool
        def lookup(query: str) -> str:
            """Look something up (fails its first ``failures`` calls)."""
            self.looked_up.append(query)
            if len(self.looked_up) <= self.failures:
                raise ConnectionError(f"lookup backend down (call {len(self.looked_up)})")
            return f"found {query}: " + "z" * 3000

        return [delete_file, lookup]


def _outputs(model: ScriptedModel) -> dict[str, str]:
    """The function call outputs the model was last sent, by call id."""
    items = model.calls[-1].input
    return {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}


def _events(sink: EventSink) -> list[Any]:
    seen: list[Any] = []
    sink.subscribe(seen.append)
    return seen


class Seen(Layer):
    """A user's own tool layer: records every call and result going through the onion."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.results: list[str] = []

    async def wrap_tool(self, call: Any, ctx: Any, call_next: Any) -> ToolResult:
        self.calls.append((call.id, call.name, dict(call.arguments)))
        result: ToolResult = await call_next(call, ctx)
        self.results.append(result.text)
        return result


class TestToolLayers:
    """The stack's tool onion runs around every call of the SDK's function tools."""

    async def test_a_custom_layer_sees_every_call(self) -> None:
        """A user layer sees each call (id, name, arguments) and result; the SDK sends the
        tool's own output on to the model."""
        ledger, seen = Ledger(), Seen()
        model = TinyctxModel(
            ScriptedModel(
                [
                    [
                        function_call("lookup", {"query": "a"}, call_id="c1"),
                        function_call("delete_file", {"path": "/x"}, call_id="c2"),
                    ],
                    [function_call("lookup", {"query": "b"}, call_id="c3")],
                    [assistant_message("done")],
                ]
            ),
            [seen],
        )
        agent = Agent(name="a", model=model, tools=model.wrap_tools(ledger.tools()))
        result = await Runner.run(agent, "go", run_config=CONFIG)
        assert result.final_output == "done"
        assert seen.calls == [
            ("c1", "lookup", {"query": "a"}),
            ("c2", "delete_file", {"path": "/x"}),
            ("c3", "lookup", {"query": "b"}),
        ]
        assert seen.results[1] == "deleted /x"
        assert ledger.deleted == ["/x"] and ledger.looked_up == ["a", "b"]
        assert _outputs(model.model)["c2"] == "deleted /x"

    async def test_tool_retry_retries_a_failing_sdk_tool(self) -> None:
        """A tool that fails twice runs a third time under ToolRetry(3): the model reads
        its answer, and the retry's events say so."""
        ledger, sink = Ledger(failures=2), EventSink()
        events = _events(sink)
        inner = ScriptedModel(
            [[function_call("lookup", {"query": "q"}, call_id="c1")], [assistant_message("ok")]]
        )
        model = TinyctxModel(inner, [ToolRetry(3, backoff=0)], events=sink)
        agent = Agent(name="a", model=model, tools=model.wrap_tools(ledger.tools()))
        await Runner.run(agent, "go", run_config=CONFIG)
        assert ledger.looked_up == ["q", "q", "q"]
        assert _outputs(inner)["c1"].startswith("found q")
        kinds = [e.kind for e in events if e.kind.startswith("tool_retry")]
        assert kinds == ["tool_retry.failed", "tool_retry.failed", "tool_retry.attempt"]

    async def test_exhausted_retries_answer_and_unhandled_failures_keep_the_sdk_policy(
        self,
    ) -> None:
        """Attempts run out: tinyctx's error result; no retry layer: the SDK tool's own
        failure policy (its default message) answers, and the run goes on."""
        for layers, expected in (
            ([ToolRetry(2, backoff=0)], "(failed after 2 attempts)"),
            ([], "An error occurred while running the tool"),
        ):
            ledger = Ledger(failures=5)
            inner = ScriptedModel(
                [[function_call("lookup", {"query": "q"}, call_id="c1")], [assistant_message("ok")]]
            )
            model = TinyctxModel(inner, layers)
            agent = Agent(name="a", model=model, tools=model.wrap_tools(ledger.tools()))
            result = await Runner.run(agent, "go", run_config=CONFIG)
            assert result.final_output == "ok"
            assert expected in _outputs(inner)["c1"]
            assert len(ledger.looked_up) == (2 if layers else 1)

    async def test_limits_and_the_result_budget_through_the_input_filter(self) -> None:
        """With the input filter, the tool layers still run: CallLimits refuses a second
        lookup (not run), ToolResultBudget cuts a long result before the SDK keeps it."""
        ledger = Ledger()
        inner = ScriptedModel(
            [
                [function_call("lookup", {"query": "a"}, call_id="c1")],
                [function_call("lookup", {"query": "b"}, call_id="c2")],
                [assistant_message("ok")],
            ]
        )
        layers = [
            ToolResultBudget(budget_bytes=500),
            CallLimits(per_tool={"lookup": 1}, exit="continue"),
        ]
        where = TinyctxInputFilter(layers)
        agent = Agent(name="a", model=inner, tools=where.wrap_tools(ledger.tools()))
        config = RunConfig(call_model_input_filter=where, tracing_disabled=True)
        await Runner.run(agent, "go", run_config=config)
        outputs = _outputs(inner)
        assert ledger.looked_up == ["a"]
        assert len(outputs["c1"].encode()) <= 500 and outputs["c1"].startswith("found a")
        assert "limit" in outputs["c2"] and "not run" in outputs["c2"]

    def test_a_filter_on_a_function_thread_needs_the_tools_thread(self) -> None:
        """A filter whose thread is a function of the call cannot guess the tools' thread:
        a ConfigError names thread_id."""
        where = TinyctxInputFilter([], thread_id=lambda data: "t")
        with pytest.raises(ValueError, match="thread_id"):
            where.wrap_tools(Ledger().tools())
        assert len(where.wrap_tools(Ledger().tools(), thread_id="t")) == 2


def _reviewing(ledger: Ledger, sink: EventSink | None = None) -> tuple[Any, ScriptedModel, Any]:
    inner = ScriptedModel(
        [
            [
                function_call("delete_file", {"path": "/etc"}, call_id="d1"),
                function_call("lookup", {"query": "q"}, call_id="l1"),
            ],
            [assistant_message("finished")],
        ]
    )
    model = TinyctxModel(inner, [Approvals("delete_file")], events=sink)
    agent = Agent(name="a", model=model, tools=model.wrap_tools(ledger.tools()))
    return agent, inner, model


async def _resumed(agent: Any, result: Any, decide: Any) -> Any:
    """Decide each interruption on a state that went through its JSON form (as a review
    UI in another request would), then resume the run."""
    state = await RunState.from_string(agent, result.to_state().to_string())
    for item in state.get_interruptions():
        decide(state, item)
    return await Runner.run(agent, state, run_config=CONFIG)


class TestApprovals:
    """tinyctx's review holds a call as the SDK's interruption, decided through RunState."""

    def test_the_payload_type_is_the_review_layer_s(self) -> None:
        """The adapter reads the pauses Approvals makes."""
        assert REVIEW_PAYLOAD == REVIEW_PAYLOAD_TYPE

    async def test_approved_calls_run_exactly_once(self) -> None:
        """The reviewed call is an interruption and has not run (the unreviewed one of the
        batch waits with it); approved and resumed, it runs once, through the review
        layer (its ReviewDecided event), and the run finishes."""
        ledger, sink = Ledger(), EventSink()
        events = _events(sink)
        agent, inner, _ = _reviewing(ledger, sink)
        paused = await Runner.run(agent, "clean up", run_config=CONFIG)
        assert [type(i) for i in paused.interruptions] == [ToolApprovalItem]
        assert paused.interruptions[0].raw_item.call_id == "d1"
        assert ledger.deleted == []
        assert [e.kind for e in events if e.kind == "review.requested"] == ["review.requested"]
        done = await _resumed(agent, paused, lambda state, item: state.approve(item))
        assert done.final_output == "finished"
        assert ledger.deleted == ["/etc"] and ledger.looked_up == ["q"]
        decided = [e for e in events if e.kind == "review.decided"]
        assert [(e.tool_call_id, e.decision) for e in decided] == [("d1", "approve")]
        messages = from_agents_items(inner.calls[-1].input)
        check_pairing(messages, allow_pending=False)
        assert _outputs(inner)["d1"] == "deleted /etc"

    async def test_rejected_calls_never_run(self) -> None:
        """Rejected with a message, the call never runs and the model reads the message as
        its one result."""
        ledger = Ledger()
        agent, inner, _ = _reviewing(ledger)
        paused = await Runner.run(agent, "clean up", run_config=CONFIG)
        done = await _resumed(
            agent, paused, lambda state, item: state.reject(item, rejection_message="not /etc")
        )
        assert done.final_output == "finished"
        assert ledger.deleted == [] and ledger.looked_up == ["q"]
        items = inner.calls[-1].input
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        assert sorted(i["call_id"] for i in outputs) == ["d1", "l1"]
        assert _outputs(inner)["d1"] == "not /etc"

    async def test_standing_decisions_decide_without_an_interruption(self) -> None:
        """Approvals.remember on the thread: approve runs at once, reject answers as
        tinyctx's review does; neither stops the run."""
        for decision, deleted in ((Approve(), ["/etc"]), (Reject("never"), [])):
            ledger = Ledger()
            agent, inner, model = _reviewing(ledger)
            (approvals,) = model.stack.layers
            await approvals.remember(model.stack.context("default"), "delete_file", decision)
            result = await Runner.run(agent, "clean up", run_config=CONFIG)
            assert result.interruptions == [] and result.final_output == "finished"
            assert ledger.deleted == deleted
            if deleted == []:
                assert "never" in _outputs(inner)["d1"]

    async def test_the_input_filter_reviews_too(self) -> None:
        """With the stack as an input filter (it sees no response), the wrapped tool's
        needs_approval still asks the review: the call is held, then approved."""
        ledger = Ledger()
        inner = ScriptedModel(
            [
                [function_call("delete_file", {"path": "/tmp"}, call_id="d1")],
                [assistant_message("finished")],
            ]
        )
        where = TinyctxInputFilter([Approvals("delete_file")])
        agent = Agent(name="a", model=inner, tools=where.wrap_tools(ledger.tools()))
        config = RunConfig(call_model_input_filter=where, tracing_disabled=True)
        paused = await Runner.run(agent, "go", run_config=config)
        assert len(paused.interruptions) == 1 and ledger.deleted == []
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        done = await Runner.run(agent, state, run_config=config)
        assert done.final_output == "finished" and ledger.deleted == ["/tmp"]

    async def test_unwrapped_tools_are_never_run_unreviewed(self) -> None:
        """A review of a tool the SDK does not gate (not wrapped) cannot become an SDK
        approval: TinyctxModel raises StackInterrupted before anything runs."""
        ledger = Ledger()
        inner = ScriptedModel([[function_call("delete_file", {"path": "/"}, call_id="d1")]])
        model = TinyctxModel(inner, [Approvals("delete_file")])
        agent = Agent(name="a", model=model, tools=ledger.tools())
        with pytest.raises(StackInterrupted, match="review"):
            await Runner.run(agent, "go", run_config=CONFIG)
        assert ledger.deleted == []

    async def test_wrap_tools_over_any_stack_keeps_other_tools(self) -> None:
        """wrap_tools takes any Stack; what is not an SDK function tool passes unchanged."""
        stack = Stack([Seen()])
        other = object()
        wrapped = wrap_tools([*Ledger().tools(), other], stack, thread_id="t")
        assert wrapped[2] is other
        assert [t.name for t in wrapped[:2]] == ["delete_file", "lookup"]

    async def test_an_approval_the_review_does_not_allow_runs_nothing(self) -> None:
        """A tool whose review allows only rejection stays unrun when the SDK approves it:
        the model reads why."""
        from tinyctx.middleware import Review

        ledger = Ledger()
        inner = ScriptedModel(
            [
                [function_call("delete_file", {"path": "/"}, call_id="d1")],
                [assistant_message("finished")],
            ]
        )
        model = TinyctxModel(inner, [Approvals({"delete_file": Review(allowed=("reject",))})])
        agent = Agent(name="a", model=model, tools=model.wrap_tools(ledger.tools()))
        paused = await Runner.run(agent, "go", run_config=CONFIG)
        done = await _resumed(agent, paused, lambda state, item: state.approve(item))
        assert done.final_output == "finished" and ledger.deleted == []
        assert "not allowed" in _outputs(inner)["d1"]
