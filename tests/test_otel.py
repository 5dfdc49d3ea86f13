"""tinyctx.otel: events become OpenTelemetry spans (GenAI semantic conventions), checked
with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tinyctx import Agent, EventSink, RunCancelled, RunContext, Session, Tool
from tinyctx.middleware import BudgetGuard, Inherit, TrimOldest
from tinyctx.middleware.inheritance import run_subagent
from tinyctx.otel import OtelExporter
from tinyctx.testing import HANG, ScriptedModel, call, reply


def tracing(**options: Any) -> tuple[OtelExporter, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return OtelExporter(tracer_provider=provider, **options), memory


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def echo(arguments: Any, ctx: RunContext[Any]) -> str:
    return f"found {arguments.get('q', '')}"


SEARCH = Tool("search", "Search.", handler=echo)


async def run(agent: Agent, exporter: OtelExporter, text: str = "hi") -> Any:
    async with Session(agent, events=EventSink(logger=None, subscribers=[exporter])) as session:
        return await session.run(text)


class TestSpans:
    """A run, its model calls and tool calls become nested spans with gen_ai attributes."""

    async def test_run_chat_and_tool_spans_nest_with_attributes(self, anyio_backend: str) -> None:
        """invoke_agent holds chat and execute_tool spans; model, usage, tool name and id."""
        exporter, memory = tracing()
        model = ScriptedModel(
            [
                reply("", call("search", id="c1", q="otel"), usage=(120, 7), model="gpt-x"),
                reply("done", usage=(150, 3), model="gpt-x"),
            ]
        )
        await run(Agent(model=model, tools=[SEARCH], name="helper", model_name="gpt-x"), exporter)
        spans = memory.get_finished_spans()
        (root,) = by_name(spans, "invoke_agent")
        chats, tools = by_name(spans, "chat"), by_name(spans, "execute_tool")
        assert root.name == "invoke_agent helper"
        assert root.attributes["gen_ai.operation.name"] == "invoke_agent"  # type: ignore[index]
        assert [c.name for c in chats] == ["chat gpt-x", "chat gpt-x"]
        assert [c.attributes["gen_ai.usage.input_tokens"] for c in chats] == [120, 150]  # type: ignore[index]
        assert [c.attributes["gen_ai.usage.output_tokens"] for c in chats] == [7, 3]  # type: ignore[index]
        assert chats[0].attributes["gen_ai.request.model"] == "gpt-x"  # type: ignore[index]
        assert chats[0].attributes["gen_ai.response.model"] == "gpt-x"  # type: ignore[index]
        (tool,) = tools
        assert tool.name == "execute_tool search"
        assert tool.attributes["gen_ai.tool.name"] == "search"  # type: ignore[index]
        assert tool.attributes["gen_ai.tool.call.id"] == "c1"  # type: ignore[index]
        for child in (*chats, tool):
            assert child.parent is not None and child.parent.span_id == root.context.span_id
            assert child.context.trace_id == root.context.trace_id
            assert root.start_time <= child.start_time <= child.end_time <= root.end_time  # type: ignore[operator]
        assert root.status.status_code == StatusCode.UNSET

    async def test_sub_agents_nest_under_the_parent_run(self, anyio_backend: str) -> None:
        """A sub-agent's invoke_agent span is a child of its parent's, in the same trace."""
        exporter, memory = tracing()
        child = Agent(model=ScriptedModel([reply("sub answer", model="small")]), name="researcher")

        async def delegate(arguments: Any, ctx: RunContext[Any]) -> str:
            result = await run_subagent(child, "look it up", ctx)
            return result.text

        parent_model = ScriptedModel([reply("", call("delegate", id="d1")), reply("ok")])
        agent = Agent(
            model=parent_model,
            tools=[Tool("delegate", "Delegate.", handler=delegate)],
            middleware=[Inherit()],
            name="planner",
        )
        await run(agent, exporter)
        spans = memory.get_finished_spans()
        planner = next(s for s in spans if s.name == "invoke_agent planner")
        researcher = next(s for s in spans if s.name == "invoke_agent researcher")
        assert researcher.parent is not None
        assert researcher.parent.span_id == planner.context.span_id
        assert researcher.context.trace_id == planner.context.trace_id
        sub_chat = next(
            s for s in spans if (s.attributes or {}).get("gen_ai.response.model") == "small"
        )
        assert sub_chat.parent is not None and sub_chat.parent.span_id == researcher.context.span_id


class TestContextActions:
    """Pressure and compaction appear as span events carrying the tokens they freed."""

    async def test_policy_actions_are_span_events_with_tokens_freed(
        self, anyio_backend: str
    ) -> None:
        """A budget guard trimming history adds context.* events with tinyctx.tokens_freed."""
        exporter, memory = tracing()
        big = "word " * 400
        script = [reply("", call("search", id=f"c{i}", q=big)) for i in range(6)] + ["end"]
        guard = BudgetGuard(
            max_tokens=1500, reserved_output_tokens=100, policies=[TrimOldest(keep_recent=2)]
        )
        await run(Agent(model=ScriptedModel(script), tools=[SEARCH], middleware=[guard]), exporter)
        (root,) = by_name(memory.get_finished_spans(), "invoke_agent")
        kinds = [e.name for e in root.events]
        assert "context.pressure" in kinds and "context.policy_applied" in kinds
        applied = [e for e in root.events if e.name == "context.policy_applied"]
        assert all(e.attributes["tinyctx.tokens_freed"] > 0 for e in applied)  # type: ignore[index,operator]
        assert applied[0].attributes["tinyctx.policy"] == "TrimOldest"  # type: ignore[index]


class TestReviewAndRetries:
    """A review pause and its decisions, and retried tool calls, are on the run spans a
    trace shows."""

    async def test_review_requested_and_decided_are_span_events(self, anyio_backend: str) -> None:
        """The paused run's span says which calls wait for review; the resumed run's span
        says what was decided for each."""
        from tinyctx import Interrupted
        from tinyctx.decisions import Approve
        from tinyctx.middleware import Approvals

        exporter, memory = tracing()
        model = ScriptedModel([reply("", call("search", id="s1", q="x")), reply("done")])
        agent = Agent(model=model, tools=[SEARCH], middleware=[Approvals("search")])
        sink = EventSink(logger=None, subscribers=[exporter])
        async with Session(agent, events=sink) as session:
            with pytest.raises(Interrupted):
                await session.run("look")
            await session.resume(decisions={"s1": Approve()})
        paused, resumed = sorted(
            by_name(memory.get_finished_spans(), "invoke_agent"), key=lambda s: s.start_time or 0
        )
        (requested,) = [e for e in paused.events if e.name == "review.requested"]
        assert list(requested.attributes["tinyctx.tool_call_ids"]) == ["s1"]  # type: ignore[index,arg-type]
        assert list(requested.attributes["tinyctx.tools"]) == ["search"]  # type: ignore[index,arg-type]
        (decided,) = [e for e in resumed.events if e.name == "review.decided"]
        assert decided.attributes["tinyctx.decision"] == "approve"  # type: ignore[index]
        assert decided.attributes["tinyctx.tool_call_id"] == "s1"  # type: ignore[index]

    async def test_a_suspended_call_has_a_span_for_each_run(self, anyio_backend: str) -> None:
        """A call that suspended the run (a sub-agent's review) has an execute_tool span
        for its first run, marked with the pause's node, and another for its run after the
        resume; the sub-agent's own spans nest under each."""
        from tinyctx import Interrupted
        from tinyctx.decisions import Approve
        from tinyctx.middleware import Approvals, subagent_tool

        exporter, memory = tracing()
        child = Agent(
            model=ScriptedModel([reply("", call("search", id="s1", q="x")), reply("found")]),
            tools=[SEARCH],
            middleware=[Approvals("search")],
            name="helper",
        )
        model = ScriptedModel([reply("", call("helper", id="h1", task="look")), reply("done")])
        agent = Agent(model=model, tools=[subagent_tool(child)])
        sink = EventSink(logger=None, subscribers=[exporter])
        async with Session(agent, events=sink) as session:
            with pytest.raises(Interrupted):
                await session.run("look")
            await session.resume(decisions={"s1": Approve()})
        spans = memory.get_finished_spans()
        first, second = sorted(
            by_name(spans, "execute_tool helper"), key=lambda s: s.start_time or 0
        )
        assert first.attributes["tinyctx.tool.suspended"] == "helper/Approvals"  # type: ignore[index]
        assert second.attributes is not None
        assert "tinyctx.tool.suspended" not in second.attributes
        assert first.attributes["gen_ai.tool.call.id"] == "h1"  # type: ignore[index]
        assert second.attributes["gen_ai.tool.call.id"] == "h1"
        (searched,) = by_name(spans, "execute_tool search")
        assert searched.attributes["gen_ai.tool.call.id"] == "s1"  # type: ignore[index]

    async def test_a_tool_retry_is_a_span_event(self, anyio_backend: str) -> None:
        """A tool call retried after a failure shows the attempt on the run's span."""
        from tinyctx.middleware import ToolRetry

        calls = 0

        async def flaky(arguments: Any, ctx: RunContext[Any]) -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise OSError("disk busy")
            return "ok"

        exporter, memory = tracing()
        model = ScriptedModel([reply("", call("flaky", id="f1")), reply("done")])
        tool = Tool("flaky", "Flaky.", handler=flaky)
        agent = Agent(model=model, tools=[tool], middleware=[ToolRetry(attempts=2, backoff=0)])
        await run(agent, exporter)
        (root,) = by_name(memory.get_finished_spans(), "invoke_agent")
        (attempt,) = [e for e in root.events if e.name == "tool_retry.attempt"]
        assert attempt.attributes["tinyctx.tool"] == "flaky"  # type: ignore[index]
        assert attempt.attributes["tinyctx.attempt"] == 2  # type: ignore[index]


class TestContent:
    """Message content is off by default and recorded only when asked."""

    async def test_no_content_by_default(self, anyio_backend: str) -> None:
        """Without capture_content no span carries messages, arguments or results."""
        exporter, memory = tracing()
        model = ScriptedModel([reply("", call("search", q="secret")), "the secret answer"])
        await run(Agent(model=model, tools=[SEARCH]), exporter, "my secret question")
        for span in memory.get_finished_spans():
            text = json.dumps(dict(span.attributes or {}))
            assert "secret" not in text
            keys = list(span.attributes or {})
            assert not any(k.startswith(("gen_ai.input", "gen_ai.output")) for k in keys)
        with pytest.raises(ValueError, match="capture_content=True"):
            exporter.content_layer()

    async def test_opt_in_content_follows_the_conventions(self, anyio_backend: str) -> None:
        """capture_content=True and its layer record input/output messages and tool I/O."""
        exporter, memory = tracing(capture_content=True)
        model = ScriptedModel([reply("", call("search", id="c1", q="otel")), "all done"])
        agent = Agent(
            model=model,
            tools=[SEARCH],
            middleware=[exporter.content_layer()],
            system_prompt="be brief",
        )
        await run(agent, exporter, "what is otel?")
        spans = memory.get_finished_spans()
        first, second = by_name(spans, "chat")
        inputs = json.loads(first.attributes["gen_ai.input.messages"])  # type: ignore[index,arg-type]
        assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "what is otel?"}]}]
        outputs = json.loads(second.attributes["gen_ai.output.messages"])  # type: ignore[index,arg-type]
        assert outputs[0]["parts"] == [{"type": "text", "content": "all done"}]
        assert "be brief" in first.attributes["gen_ai.system_instructions"]  # type: ignore[index,operator]
        (tool,) = by_name(spans, "execute_tool")
        assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"q": "otel"}  # type: ignore[index,arg-type]
        assert tool.attributes["gen_ai.tool.call.result"] == "found otel"  # type: ignore[index]


class TestStatus:
    """Cancellation and failures set the span status."""

    async def test_a_failing_model_marks_the_run_span_error(self, anyio_backend: str) -> None:
        """A model error ends the run span with ERROR and the exception type."""
        exporter, memory = tracing()
        agent = Agent(model=ScriptedModel([RuntimeError("provider down")]))
        with pytest.raises(RuntimeError):
            await run(agent, exporter)
        (root,) = by_name(memory.get_finished_spans(), "invoke_agent")
        assert root.status.status_code == StatusCode.ERROR
        assert "provider down" in (root.status.description or "")
        assert root.attributes["error.type"] == "RuntimeError"  # type: ignore[index]

    async def test_a_cancelled_run_is_an_error_span_with_the_reason(
        self, anyio_backend: str
    ) -> None:
        """Cancelling a hanging run ends its span with ERROR and a run.cancelled event."""
        exporter, memory = tracing()
        agent = Agent(model=ScriptedModel([HANG]))
        sink = EventSink(logger=None, subscribers=[exporter])
        async with Session(agent, events=sink) as session:

            async def stop() -> None:
                await anyio.sleep(0.05)
                session.cancel_run("user pressed stop")

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop)
                with pytest.raises(RunCancelled):
                    await session.run("go")
        (root,) = by_name(memory.get_finished_spans(), "invoke_agent")
        assert root.status.status_code == StatusCode.ERROR
        assert root.attributes["tinyctx.status"] == "cancelled"  # type: ignore[index]
        (cancelled,) = [e for e in root.events if e.name == "run.cancelled"]
        assert cancelled.attributes["tinyctx.reason"] == "user pressed stop"  # type: ignore[index]

    async def test_a_failing_tool_marks_its_span_error(self, anyio_backend: str) -> None:
        """A tool that raises: its execute_tool span is ERROR and the run records why."""
        exporter, memory = tracing()

        async def broken(arguments: Any, ctx: RunContext[Any]) -> str:
            raise OSError("disk full")

        model = ScriptedModel([reply("", call("save", id="s1")), "sorry"])
        agent = Agent(model=model, tools=[Tool("save", "Save.", handler=broken)])
        await run(agent, exporter)
        spans = memory.get_finished_spans()
        (tool,) = by_name(spans, "execute_tool")
        assert tool.status.status_code == StatusCode.ERROR
        (root,) = by_name(spans, "invoke_agent")
        failed = [e for e in root.events if e.name == "tool.failed"]
        assert failed and failed[0].attributes["error.type"] == "OSError"  # type: ignore[index]


class TestInvariants:
    """Whatever the script, every span closes and nests inside its run."""

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5))
    def test_every_call_has_a_span_inside_the_run(self, batches: list[int]) -> None:
        """N model calls and their tool calls give N chat and sum(calls) tool spans."""
        exporter, memory = tracing()
        script: list[Any] = [
            reply("", *(call("search", q=str(i)) for i in range(n))) if n else reply("thinking")
            for n in batches[:-1]
        ]
        script = [s for s in script if s.message.tool_calls] + ["done"]
        calls = sum(len(s.message.tool_calls) for s in script[:-1])
        anyio.run(run, Agent(model=ScriptedModel(script), tools=[SEARCH]), exporter)
        spans = memory.get_finished_spans()
        (root,) = by_name(spans, "invoke_agent")
        assert len(by_name(spans, "chat")) == len(script)
        assert len(by_name(spans, "execute_tool")) == calls
        for span in spans:
            if span is not root:
                assert span.parent is not None and span.parent.span_id == root.context.span_id
                assert root.start_time <= span.start_time <= span.end_time <= root.end_time  # type: ignore[operator]


class TestExtra:
    """Without the extra installed, the import says how to get it."""

    def test_import_without_opentelemetry_names_the_extra(self) -> None:
        """`import tinyctx.otel` without OpenTelemetry: pip install 'tinyctx[otel]'."""
        code = "import sys; sys.modules['opentelemetry'] = None; import tinyctx.otel"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert result.returncode != 0
        assert "pip install 'tinyctx[otel]'" in result.stderr
