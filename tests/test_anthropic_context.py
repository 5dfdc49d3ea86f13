"""AnthropicContextEditing: Anthropic's server-side clearing of old tool results as a layer,
against a loopback server and the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_message,
    json_reply,
)
from tinyctx import Agent, ConfigError, EventSink, Session
from tinyctx.otel import OtelExporter
from tinyctx.providers import AnthropicModel
from tinyctx.providers.anthropic_context import (
    CONTEXT_MANAGEMENT_BETA,
    AnthropicContextEditing,
    ProviderContextEdited,
)
from tinyctx.testing import FakeTool, capture_events

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic_client(server) as sdk_client:
        yield sdk_client


class TestContextEditing:
    """Each wrapped call asks for the edit; what the server cleared is reported."""

    async def test_the_edit_and_beta_go_with_every_call_and_clearing_is_reported(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """Both calls carry the edit and the beta header (merged with the user's); the
        applied edit becomes an event on the run and on the chat span; the thread keeps
        every tool result."""
        tool_use = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}
        cleared = anthropic_message([{"type": "text", "text": "done"}])
        cleared["context_management"] = {
            "applied_edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "cleared_tool_uses": 4,
                    "cleared_input_tokens": 5200,
                }
            ]
        }
        server.add(json_reply(anthropic_message([tool_use])), json_reply(cleared))
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        exporter = OtelExporter(tracer_provider=provider)
        layer = AnthropicContextEditing(trigger_tokens=30_000, keep_tool_uses=2)
        model = AnthropicModel("claude-sonnet-4-6", client=client, extra_body={"metadata": {}})
        agent = Agent(
            model,
            tools=[FakeTool("search").tool],
            middleware=[layer],
            settings={"extra_headers": {"anthropic-beta": "other-beta"}},
        )
        with capture_events(ProviderContextEdited) as events:
            async with Session(agent, events=EventSink(subscribers=[exporter])) as session:
                await session.run("go")
                history = session.conversation_messages
        for recorded in server.requests:
            body = recorded.json()
            assert body["context_management"] == {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "trigger": {"type": "input_tokens", "value": 30_000},
                        "keep": {"type": "tool_uses", "value": 2},
                    }
                ]
            }
            assert recorded.headers["anthropic-beta"] == f"other-beta,{CONTEXT_MANAGEMENT_BETA}"
            assert body["metadata"] == {}  # the adapter's extra_body is merged, not replaced
        (event,) = events
        assert isinstance(event, ProviderContextEdited)
        assert (event.cleared_tool_uses, event.freed_tokens) == (4, 5200)
        assert len(history) == 4  # the thread keeps the result the server cleared
        chat = [s for s in memory.get_finished_spans() if s.name.startswith("chat")][-1]
        attributes = dict(chat.attributes or {})
        assert list(attributes["tinyctx.compaction.layers"]) == ["AnthropicContextEditing"]  # type: ignore[arg-type]
        assert attributes["tinyctx.compaction.tokens_freed"] == 5200

    def test_bad_settings_name_the_field(self) -> None:
        """A trigger below 1 or a non-string tool name is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="trigger_tokens"):
            AnthropicContextEditing(trigger_tokens=0)
        with pytest.raises(ConfigError, match="exclude_tools"):
            AnthropicContextEditing(exclude_tools=[3])  # type: ignore[list-item]
