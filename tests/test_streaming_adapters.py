"""Session.stream over the real OpenAI and Anthropic SDKs, against loopback servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_stream,
    openai_client,
    openai_stream,
    sse_reply,
)
from tests.loopback_wire import close_gemini, gemini_client, gemini_stream
from tinyctx import Agent, Session
from tinyctx.messages import check_pairing
from tinyctx.providers import AnthropicModel, GeminiModel, OpenAIChatModel
from tinyctx.streaming import (
    FinalResult,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolFinished,
)
from tinyctx.testing import FakeTool

pytestmark = [
    pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING),
    pytest.mark.filterwarnings(
        r"ignore:Async generator 'google\.genai\.[^']*' was garbage collected before it had "
        r"been exhausted:ResourceWarning"
    ),
]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


def _texts(items: list[StreamEvent]) -> list[str]:
    return [i.text for i in items if isinstance(i, TextDelta)]


class TestOpenAIStreamed:
    """An OpenAI chat model built without stream=True streams inside Session.stream."""

    async def test_a_tool_run_streams_deltas_and_ends_with_the_result(
        self, server: LoopbackServer
    ) -> None:
        """Tool-call deltas, the tool's result and the answer's text arrive as they are sent."""
        server.add(
            sse_reply(openai_stream([], [("call_1", "search", ['{"q":', ' "a"}'])])),
            sse_reply(openai_stream(["Do", "ne."])),
        )
        search = FakeTool("search", returns="A")
        async with openai_client(server) as client:
            agent = Agent(OpenAIChatModel("gpt-4o", client=client), tools=[search.tool])
            async with Session(agent) as session:
                items = [i async for i in session.stream("go")]
        assert [server.requests[n].json().get("stream") for n in range(2)] == [True, True]
        fragments = [i.arguments_delta for i in items if isinstance(i, ToolCallDelta)]
        assert "".join(fragments) == '{"q": "a"}'
        assert any(isinstance(i, ToolFinished) and i.tool_call_id == "call_1" for i in items)
        assert _texts(items) == ["Do", "ne."]
        final = items[-1]
        assert isinstance(final, FinalResult)
        assert final.result.final_text == "Done."

    async def test_closing_mid_stream_closes_the_response(self, server: LoopbackServer) -> None:
        """aclose() during a held stream cancels the run; nothing partial is added."""
        server.add(sse_reply(openai_stream(["half ", "an answer"], done=False), hold=True))
        async with openai_client(server) as client:
            agent = Agent(OpenAIChatModel("gpt-4o", client=client))
            async with Session(agent) as session:
                async with session.stream("go") as events:
                    async for item in events:
                        if isinstance(item, TextDelta):
                            break
                messages = session.conversation_messages
        assert [m.role for m in messages] == ["user"]
        check_pairing(messages)


class TestAnthropicStreamed:
    """An Anthropic model streams its thinking and text inside Session.stream."""

    async def test_thinking_and_text_deltas(self, server: LoopbackServer) -> None:
        """Thinking arrives as ReasoningDelta, the answer as TextDelta, then the result."""
        server.add(
            sse_reply(
                anthropic_stream([("thinking", ("Plan.", "sig")), ("text", ["All ", "good."])])
            )
        )
        async with anthropic_client(server) as client:
            agent = Agent(AnthropicModel("claude-sonnet-4-6", client=client))
            async with Session(agent) as session:
                items = [i async for i in session.stream("go")]
        assert server.requests[0].json()["stream"] is True
        assert [i.text for i in items if isinstance(i, ReasoningDelta)] == ["Plan."]
        assert _texts(items) == ["All ", "good."]
        final = items[-1]
        assert isinstance(final, FinalResult)
        assert final.result.final_text == "All good."


class TestGeminiStreamed:
    """A Gemini model streams its thought summaries and text inside Session.stream."""

    async def test_thoughts_and_text_deltas(self, server: LoopbackServer) -> None:
        """A thought part arrives as ReasoningDelta, text parts as TextDelta."""
        chunks = [[{"text": "Hmm.", "thought": True}], [{"text": "Yes, "}], [{"text": "it is."}]]
        server.add(sse_reply(gemini_stream(chunks, usage=(10, 5, 0, 0))))
        client = gemini_client(server)
        try:
            agent = Agent(GeminiModel("gemini-2.5-flash", client=client))
            async with Session(agent) as session:
                items = [i async for i in session.stream("go")]
        finally:
            await close_gemini(client)
        assert server.requests[0].path.endswith(":streamGenerateContent?alt=sse")
        assert [i.text for i in items if isinstance(i, ReasoningDelta)] == ["Hmm."]
        assert _texts(items) == ["Yes, ", "it is."]
        final = items[-1]
        assert isinstance(final, FinalResult)
        assert final.result.final_text == "Yes, it is."
