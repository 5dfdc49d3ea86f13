"""tinyctx.otel against the GenAI semantic conventions: what the spans of real adapter runs
(loopback servers, real SDKs) say, and every attribute name checked against the
conventions' registry vendored in tests/data/genai_semconv_registry.json."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_message,
    json_reply,
    openai_client,
    openai_completion,
)
from tinyctx import Agent, EventSink, RunContext, Session, Tool
from tinyctx.middleware import BudgetGuard, TrimOldest
from tinyctx.otel import OtelExporter
from tinyctx.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

REGISTRY = json.loads(
    (Path(__file__).parent / "data" / "genai_semconv_registry.json").read_text("utf-8")
)
OWN = "tinyctx."
TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "double": (float, int),
    "boolean": (bool,),
    "string[]": (tuple,),
    "any": (str, int, float, bool, tuple),
    "enum": (str,),
}


def tracing(**options: Any) -> tuple[OtelExporter, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return OtelExporter(tracer_provider=provider, **options), memory


def chats(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(("chat", "generate_content"))]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def every_attribute(spans: Sequence[ReadableSpan]) -> Iterator[tuple[str, str, Any]]:
    """(where, name, value) of every attribute of every span and span event."""
    for span in spans:
        for name, value in (span.attributes or {}).items():
            yield span.name, name, value
        for event in span.events:
            for name, value in (event.attributes or {}).items():
                yield f"{span.name}/{event.name}", name, value


def check_against_registry(spans: Sequence[ReadableSpan]) -> set[str]:
    """Every attribute outside tinyctx.* is in the registry with its type (and, for an
    enum, one of its members); returns the registry names seen."""
    seen: set[str] = set()
    for where, name, value in every_attribute(spans):
        if name.startswith(OWN):
            continue
        assert name in REGISTRY["attributes"], f"{where}: {name!r} is not in the registry"
        spec = REGISTRY["attributes"][name]
        assert isinstance(value, TYPES[spec["type"]]), f"{where}: {name}={value!r}"
        if spec["type"] == "enum":
            assert value in spec["members"], f"{where}: {name}={value!r}"
        seen.add(name)
    return seen


async def echo(arguments: Any, ctx: RunContext[Any]) -> str:
    return f"found {arguments.get('q', '')}"


async def broken(arguments: Any, ctx: RunContext[Any]) -> str:
    raise OSError("disk full")


SEARCH = Tool("search", "Search.", handler=echo)
SAVE = Tool("save", "Save.", handler=broken)


async def run(agent: Agent, exporter: OtelExporter, *texts: str, thread: str = "t-1") -> None:
    sink = EventSink(logger=None, subscribers=[exporter])
    async with Session(agent, thread_id=thread, events=sink) as session:
        for text in texts or ("hi",):
            await session.run(text)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


class TestModelSpanAttributes:
    """A chat span says what was asked of whom and what came back."""

    async def test_requested_and_answered_models_are_apart(
        self, server: LoopbackServer, anyio_backend: str
    ) -> None:
        """gpt-4o asked, gpt-4o-2024-08-06 answered: request.model, response.model and
        the span name keep them apart."""
        from tinyctx.providers import OpenAIChatModel

        server.add(json_reply(openai_completion("hi", model="gpt-4o-2024-08-06")))
        exporter, memory = tracing()
        async with openai_client(server) as client:
            await run(Agent(OpenAIChatModel("gpt-4o", client=client)), exporter)
        (chat,) = chats(memory.get_finished_spans())
        assert chat.name == "chat gpt-4o"
        assert attributes(chat)["gen_ai.request.model"] == "gpt-4o"
        assert attributes(chat)["gen_ai.response.model"] == "gpt-4o-2024-08-06"

    async def test_the_adapter_says_the_recommended_attributes(
        self, server: LoopbackServer, anyio_backend: str
    ) -> None:
        """Provider, response id, finish reasons, temperature, max tokens, server and
        cached input tokens, with no provider_name= given to the exporter."""
        from tinyctx.providers import OpenAIChatModel

        server.add(json_reply(openai_completion("hi", usage=(40, 5, 16))))
        exporter, memory = tracing()
        async with openai_client(server) as client:
            model = OpenAIChatModel(
                "gpt-4o", client=client, temperature=0.5, max_completion_tokens=100
            )
            await run(Agent(model), exporter)
        (chat,) = chats(memory.get_finished_spans())
        seen = attributes(chat)
        port = int(server.url.rsplit(":", 1)[1])
        assert {k: seen.get(k) for k in _RECOMMENDED} == {
            "gen_ai.provider.name": "openai",
            "gen_ai.response.id": "chatcmpl-loopback",
            "gen_ai.response.finish_reasons": ("stop",),
            "gen_ai.request.temperature": 0.5,
            "gen_ai.request.max_tokens": 100,
            "server.address": "127.0.0.1",
            "server.port": port,
            "gen_ai.usage.input_tokens": 40,
            "gen_ai.usage.output_tokens": 5,
            "gen_ai.usage.cache_read.input_tokens": 16,
        }

    async def test_anthropic_sets_its_provider_name(
        self, server: LoopbackServer, anyio_backend: str
    ) -> None:
        """The Anthropic adapter's spans say anthropic, its message id and stop reason."""
        from tinyctx.providers import AnthropicModel

        server.add(json_reply(anthropic_message([{"type": "text", "text": "hi"}])))
        exporter, memory = tracing()
        async with anthropic_client(server) as client:
            await run(Agent(AnthropicModel("claude-sonnet-4-6", client=client)), exporter)
        (chat,) = chats(memory.get_finished_spans())
        seen = attributes(chat)
        assert seen["gen_ai.provider.name"] == "anthropic"
        assert seen["gen_ai.response.id"] == "msg_loopback"
        assert seen["gen_ai.response.finish_reasons"] == ("end_turn",)

    async def test_an_unknown_requested_model_is_left_out(self, anyio_backend: str) -> None:
        """A model handler that names no model: no empty gen_ai.request.model."""
        exporter, memory = tracing()
        await run(Agent(ScriptedModel(["ok"])), exporter)
        (chat,) = chats(memory.get_finished_spans())
        assert "gen_ai.request.model" not in attributes(chat)
        assert chat.name == "chat"


class TestThreadAndTools:
    """Every span of a thread names it; a failed tool says why."""

    async def test_every_span_of_a_thread_has_its_conversation_id(self, anyio_backend: str) -> None:
        """Run, chat and tool spans all carry gen_ai.conversation.id."""
        exporter, memory = tracing()
        model = ScriptedModel([reply("", call("search", q="x")), "done"])
        await run(Agent(model, tools=[SEARCH]), exporter, thread="thread-42")
        spans = memory.get_finished_spans()
        assert len(spans) == 4
        assert {attributes(s).get("gen_ai.conversation.id") for s in spans} == {"thread-42"}

    async def test_a_failed_tool_span_has_error_type(self, anyio_backend: str) -> None:
        """A tool that raised: its span's error.type is the exception's type."""
        exporter, memory = tracing()
        model = ScriptedModel([reply("", call("save", id="s1")), "sorry"])
        await run(Agent(model, tools=[SAVE]), exporter)
        (tool,) = [s for s in memory.get_finished_spans() if s.name.startswith("execute_tool")]
        assert attributes(tool)["error.type"] == "OSError"


class TestCompactionOnTheModelSpan:
    """What the layers removed before a model call is on that call's span."""

    async def test_the_chat_span_after_a_trim_says_what_was_removed(
        self, anyio_backend: str
    ) -> None:
        """The chat span of a call the guard relieved has the policy events and totals;
        tokens freed appear under one name only."""
        exporter, memory = tracing()
        big = "word " * 400
        script = [reply("", call("search", id=f"c{i}", q=big)) for i in range(6)] + ["end"]
        guard = BudgetGuard(
            max_tokens=1500, reserved_output_tokens=100, policies=[TrimOldest(keep_recent=2)]
        )
        await run(Agent(ScriptedModel(script), tools=[SEARCH], middleware=[guard]), exporter)
        spans = memory.get_finished_spans()
        relieved = [c for c in chats(spans) if "tinyctx.compaction.layers" in attributes(c)]
        assert relieved, "no chat span records the compaction before it"
        first = attributes(relieved[0])
        assert list(first["tinyctx.compaction.layers"]) == ["TrimOldest"] * len(
            first["tinyctx.compaction.layers"]
        )
        assert first["tinyctx.compaction.tokens_freed"] > 0
        assert "context.policy_applied" in [e.name for e in relieved[0].events]
        for _, name, _ in every_attribute(spans):
            assert name != "tinyctx.freed_tokens"


class TestRegistry:
    """Every attribute name emitted is the conventions' (or tinyctx's own namespace)."""

    def test_the_vendored_registry_names_its_version(self) -> None:
        """The data says where it comes from, so a rename upstream is one data change."""
        assert "semantic-conventions-genai" in REGISTRY["version"]
        assert "gen_ai.provider.name" in REGISTRY["attributes"]

    async def test_every_attribute_of_real_adapter_runs_is_registered(
        self, server: LoopbackServer, anyio_backend: str
    ) -> None:
        """Responses and Gemini runs with tools, a failed tool, reasoning, cached tokens,
        a compaction and content capture: every non-tinyctx attribute is registered."""
        from tests.loopback_wire import (
            close_gemini,
            function_call_item,
            gemini_body,
            gemini_client,
            message_item,
            reasoning_item,
            responses_body,
        )
        from tinyctx.providers.gemini import GeminiModel
        from tinyctx.providers.openai_responses import OpenAIResponsesModel

        server.add(
            json_reply(
                responses_body(
                    [
                        reasoning_item("rs_1", "plan", "enc"),
                        function_call_item("call_1", "search", '{"q": "a"}', "fc_1"),
                        function_call_item("call_2", "save", "{}", "fc_2"),
                    ],
                    usage=(50, 20, 10, 8),
                )
            ),
            json_reply(responses_body([message_item("done")], response_id="resp_2")),
            json_reply(gemini_body([{"text": "hello"}], usage=(9, 2, 4, 0))),
        )
        exporter, memory = tracing(capture_content=True)
        guard = BudgetGuard(
            max_tokens=100_000, reserved_output_tokens=100, policies=[TrimOldest(keep_recent=2)]
        )
        async with openai_client(server) as client:
            model = OpenAIResponsesModel("gpt-5", client=client, temperature=0.1)
            agent = Agent(
                model,
                tools=[SEARCH, SAVE],
                middleware=[exporter.content_layer(), guard],
                system_prompt="Be brief.",
                name="helper",
            )
            await run(agent, exporter, "go")
        gemini = gemini_client(server)
        try:
            await run(Agent(GeminiModel("gemini-2.5-flash", client=gemini)), exporter)
        finally:
            await close_gemini(gemini)
        spans = memory.get_finished_spans()
        seen = check_against_registry(spans)
        assert _RECOMMENDED - {"gen_ai.request.max_tokens"} <= seen
        assert {"gen_ai.usage.reasoning.output_tokens", "error.type"} <= seen
        providers = {attributes(c).get("gen_ai.provider.name") for c in chats(spans)}
        assert providers == {"openai", "gcp.gemini"}
        operations = {attributes(c)["gen_ai.operation.name"] for c in chats(spans)}
        assert operations == {"chat", "generate_content"}


_RECOMMENDED = frozenset(
    {
        "gen_ai.provider.name",
        "gen_ai.response.id",
        "gen_ai.response.finish_reasons",
        "gen_ai.request.temperature",
        "gen_ai.request.max_tokens",
        "server.address",
        "server.port",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
    }
)
