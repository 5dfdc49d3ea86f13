"""AnthropicCompaction: Anthropic's server-side compaction (``compact_20260112``) as a layer,
against a loopback server and the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_error_body,
    anthropic_message,
    anthropic_stream,
    error_reply,
    json_reply,
    openai_client,
    openai_completion,
    sse_reply,
)
from tinyctx import Agent, AssistantMessage, ConfigError, Session, UserMessage
from tinyctx.codec import decode_messages
from tinyctx.messages import check_pairing
from tinyctx.middleware.fallback import Fallback
from tinyctx.providers.anthropic import AnthropicModel
from tinyctx.providers.anthropic_compaction import (
    COMPACTION_BETA,
    AnthropicCompaction,
    compaction_summary,
)
from tinyctx.providers.clearing import ProviderCompacted
from tinyctx.providers.openai import OpenAIChatModel
from tinyctx.stores import MemoryStore
from tinyctx.testing import FakeTool, capture_events

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

SUMMARY = "The user asked q1 and got a1; then asked q2."
COMPACTION = {"type": "compaction", "content": SUMMARY}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def compaction_stream(answer: str, usage: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A message stream whose first block is a compaction streamed as deltas; ``usage``
    comes with the final message_delta, as the API sends it."""
    events = anthropic_stream([("text", [answer])])
    for name, data in events:
        if name == "message_delta":
            data["usage"] = usage
    for _, data in events:
        if isinstance(data, dict) and "index" in data:
            data["index"] += 1
    start = {"type": "compaction", "content": None}
    block: list[tuple[str | None, Any]] = [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
    ]
    for piece in (SUMMARY[:20], SUMMARY[20:]):
        delta = {"type": "compaction_delta", "content": piece}
        block.append(
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    block.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    return [*events[:2], *block, *events[2:]]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic_client(server) as sdk_client:
        yield sdk_client


def plain_text(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    return [content] if isinstance(content, str) else [b.get("text", b["type"]) for b in content]


class TestServerCompaction:
    """The server's compaction becomes tinyctx's compaction record; the block goes back."""

    @pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
    async def test_the_summary_replaces_the_originals_which_the_store_archives(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic, stream: bool
    ) -> None:
        """Every call asks for compact_20260112 with the beta; a compaction answer replaces
        the thread before it by one summary message (originals archived), keeps the block,
        and the next request sends the block back whole after that summary."""
        iterations = [
            {"type": "compaction", "input_tokens": 61_000, "output_tokens": 900},
            {"type": "message", "input_tokens": 1_000, "output_tokens": 5},
        ]
        usage = {"input_tokens": 1_000, "output_tokens": 5, "iterations": iterations}
        compacted: Any = (
            sse_reply(compaction_stream("a2", usage=usage))
            if stream
            else json_reply(anthropic_message([COMPACTION, text("a2")], usage=usage))
        )
        later = anthropic_stream([("text", ["a3"])]) if stream else None
        server.add(
            sse_reply(anthropic_stream([("text", ["a1"])]))
            if stream
            else json_reply(anthropic_message([text("a1")])),
            compacted,
            sse_reply(later) if later else json_reply(anthropic_message([text("a3")])),
        )
        store = MemoryStore()
        layer = AnthropicCompaction(trigger_tokens=60_000, instructions="Keep file names.")
        agent = Agent(
            AnthropicModel("claude-sonnet-4-6", client=client, stream=stream),
            middleware=[layer],
            settings={"extra_headers": {"anthropic-beta": "other-beta"}},
        )
        with capture_events(ProviderCompacted) as events:
            async with Session(agent, thread_id="t", store=store) as session:
                await session.run("q1")
                await session.run("q2")
                history = session.conversation_messages
                await session.run("q3")
        for recorded in server.requests:
            assert recorded.json()["context_management"] == {
                "edits": [
                    {
                        "type": "compact_20260112",
                        "trigger": {"type": "input_tokens", "value": 60_000},
                        "instructions": "Keep file names.",
                    }
                ]
            }
            assert recorded.headers["anthropic-beta"] == f"other-beta,{COMPACTION_BETA}"
        record, answer = history
        assert isinstance(record, UserMessage)
        assert record.text.endswith(SUMMARY) and "3 earlier messages" in record.text
        assert record.metadata["tinyctx"]["summary"]["messages"] == 3
        assert isinstance(answer, AssistantMessage) and answer.content == "a2"
        assert compaction_summary(answer) == SUMMARY
        archived = await store.archived("t")
        originals = [m for r in archived for m in decode_messages(r.messages)]
        assert [getattr(m, "text", getattr(m, "content", None)) for m in originals] == [
            "q1",
            "a1",
            "q2",
        ]
        sent = server.requests[2].json()["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"][0] == COMPACTION
        (event,) = events
        assert isinstance(event, ProviderCompacted)
        assert (event.provider, event.messages_before, event.persisted) == ("anthropic", 3, True)
        assert event.freed_tokens >= 0 and not event.estimated
        assert (event.provider_input_tokens, event.provider_output_tokens) == (61_000, 900)

    async def test_a_tool_call_after_the_compaction_keeps_pairing(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """The server compacts mid-run and the answer goes on to call a tool: the result is
        paired with the call in the compacted thread and sent after the block."""
        tool_use = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}
        server.add(
            json_reply(anthropic_message([COMPACTION, tool_use])),
            json_reply(anthropic_message([text("found")])),
        )
        agent = Agent(
            AnthropicModel("claude-sonnet-4-6", client=client),
            tools=[FakeTool("search", returns="hit").tool],
            middleware=[AnthropicCompaction(trigger_tokens=50_000)],
        )
        async with Session(agent) as session:
            result = await session.run("look it up")
            history = session.conversation_messages
        assert result.final_text == "found"
        check_pairing(history, allow_pending=False)
        assert isinstance(history[0], UserMessage) and history[0].text.endswith(SUMMARY)
        sent = server.requests[1].json()["messages"]
        assert sent[1]["content"][:2] == [COMPACTION, tool_use]
        assert sent[2]["content"][0]["tool_use_id"] == "toolu_1"

    async def test_a_failed_compaction_changes_nothing(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """A compaction block without content (the server's failed compaction) leaves the
        thread as it was."""
        server.add(json_reply(anthropic_message([{"type": "compaction"}, text("ok")])))
        agent = Agent(
            AnthropicModel("claude-sonnet-4-6", client=client),
            middleware=[AnthropicCompaction(trigger_tokens=50_000)],
        )
        with capture_events(ProviderCompacted) as events:
            async with Session(agent) as session:
                await session.run("hi")
                history = session.conversation_messages
        assert events == []
        assert history[0] == UserMessage("hi")


class TestAcrossProviders:
    """After a server compaction, a fallback to OpenAI reads the summary as text."""

    async def test_fallback_after_compaction_sends_the_summary_to_openai(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """Anthropic compacts, then is overloaded: OpenAI Chat gets the summary message, the
        compacted answer as text, and the new question, without Anthropic's edit; pairing
        holds."""
        overloaded = anthropic_error_body("Overloaded", type="overloaded_error")
        server.add(
            json_reply(anthropic_message([COMPACTION, text("a1")])),
            error_reply(overloaded, 529),
            json_reply(openai_completion("from openai")),
        )
        async with openai_client(server) as gpt:
            agent = Agent(
                AnthropicModel("claude-sonnet-4-6", client=client),
                middleware=[
                    AnthropicCompaction(trigger_tokens=50_000),
                    Fallback(OpenAIChatModel("gpt-4o", client=gpt)),
                ],
            )
            async with Session(agent) as session:
                await session.run("q1")
                second = await session.run("q2")
                history = session.conversation_messages
        assert second.final_text == "from openai"
        check_pairing(history, allow_pending=False)
        sent = server.requests[2].json()["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert plain_text(sent[0])[0].endswith(SUMMARY)
        assert plain_text(sent[1]) == ["a1"]
        assert "context_management" not in server.requests[2].json()  # Anthropic's alone
        assert "anthropic-beta" not in server.requests[2].headers
        assert isinstance(gpt, openai.AsyncOpenAI)


class TestConfiguration:
    """Bad settings are a ConfigError naming the field."""

    def test_a_trigger_below_the_api_minimum_or_empty_instructions(self) -> None:
        """The API refuses triggers under 50,000; empty instructions say nothing."""
        with pytest.raises(ConfigError, match="trigger_tokens"):
            AnthropicCompaction(trigger_tokens=49_999)
        with pytest.raises(ConfigError, match="instructions"):
            AnthropicCompaction(instructions="")
        with pytest.raises(ConfigError, match="persist"):
            AnthropicCompaction(persist=1)  # type: ignore[arg-type]
