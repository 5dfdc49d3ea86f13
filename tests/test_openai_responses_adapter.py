"""OpenAIResponsesModel drives the real OpenAI SDK against a loopback Responses API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    drop_connection,
    error_reply,
    json_reply,
    openai_client,
    openai_error_body,
    sse_reply,
)
from tests.loopback_wire import (
    function_call_item,
    message_item,
    reasoning_item,
    responses_body,
    responses_stream,
)
from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    ContextLimitExceeded,
    Event,
    ImagePart,
    ModelRequest,
    ProviderError,
    RetryableProviderError,
    RunCancelled,
    RunContext,
    Session,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.codec import CodecError, decode, encode
from tinyctx.events import ModelStreamDelta
from tinyctx.messages import check_pairing
from tinyctx.providers.openai_responses import OpenAIResponsesModel
from tinyctx.testing import FakeTool, capture_events
from tinyctx.tokens import HeuristicCounter
from tinyctx.tools import ServerTool

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

SEARCH_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
PNG = ImagePart(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
    "image/png",
)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(server) as sdk_client:
        yield sdk_client


def ask(text: str = "hi", **changes: Any) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(text),), **changes)


THOUGHT = reasoning_item("rs_1", "Look it up first.", "gAAAA-encrypted-1")
CALL = function_call_item("call_1", "search", '{"q": "tinyctx"}', "fc_1")


class TestStatelessToolRun:
    """A tool-using run: reasoning and the call travel back, paired, with usage."""

    async def test_reasoning_and_call_are_sent_back_with_the_result(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """The second request carries the reasoning item verbatim, the call and its output."""
        server.add(
            json_reply(responses_body([THOUGHT, CALL], usage=(40, 30, 8, 20))),
            json_reply(responses_body([message_item("Found it.")], response_id="resp_2")),
        )
        search = FakeTool("search", returns="tinyctx manages context", parameters=SEARCH_SCHEMA)
        model = OpenAIResponsesModel("gpt-5", client=client, reasoning={"effort": "low"})
        agent = Agent(model, tools=[search.tool], system_prompt="Be brief.")
        async with Session(agent) as session:
            result = await session.run("What is tinyctx?")
            history = session.conversation_messages

        assert result.final_text == "Found it."
        assert search.calls == [{"q": "tinyctx"}]
        assert result.usage == Usage(70, 42, 8, reasoning_tokens=20)
        assert [r.path for r in server.requests] == ["/v1/responses"] * 2
        first, second = (r.json() for r in server.requests)
        assert first["store"] is False
        assert first["include"] == ["reasoning.encrypted_content"]
        assert first["instructions"] == "Be brief."
        assert first["reasoning"] == {"effort": "low"}
        assert first["input"] == [
            {"type": "message", "role": "user", "content": "What is tinyctx?"}
        ]
        assert first["tools"] == [
            {
                "type": "function",
                "name": "search",
                "parameters": SEARCH_SCHEMA,
                "strict": False,
                "description": "fake tool search",
            }
        ]
        assert second["input"][1:] == [
            THOUGHT,
            CALL,
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "tinyctx manages context",
            },
        ]
        check_pairing(history, allow_pending=False)
        turn = history[1]
        assert isinstance(turn, AssistantMessage)
        assert turn.tool_calls == (ToolCall("call_1", "search", {"q": "tinyctx"}),)

    async def test_reasoning_tokens_are_counted_with_their_turn(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """The reasoning a turn carries counts toward the budget like the text it is."""
        server.add(
            json_reply(responses_body([THOUGHT, message_item("ok")], usage=(9, 300, 0, 250)))
        )
        response = await OpenAIResponsesModel("gpt-5", client=client)(ask(), RunContext.new())
        counter = HeuristicCounter()
        bare = AssistantMessage("ok")
        assert counter.count_message(response.message) == counter.count_message(bare) + 250

    async def test_the_response_tells_what_the_call_was(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """The response carries the provider, server, models, id and finish reason."""
        server.add(
            json_reply(
                responses_body(
                    [message_item("ok")], incomplete="max_output_tokens", status="incomplete"
                )
            )
        )
        model = OpenAIResponsesModel("gpt-5", client=client, temperature=0.3, max_output_tokens=64)
        response = await model(ask(), RunContext.new())
        info = response.info
        assert info is not None
        assert (info.provider, info.request_model, response.model) == (
            "openai",
            "gpt-5",
            "gpt-5-2025-08-07",
        )
        assert (info.temperature, info.max_tokens) == (0.3, 64)
        assert info.server_address == "127.0.0.1" and info.server_port == int(
            server.url.rsplit(":", 1)[1]
        )
        assert (info.response_id, info.finish_reasons) == ("resp_1", ("max_output_tokens",))


class TestDurableThread:
    """Reasoning items are plain data: a thread stored and loaded sends them back whole."""

    async def test_a_reloaded_thread_sends_its_reasoning_back(
        self, client: openai.AsyncOpenAI, server: LoopbackServer, tmp_path: Any
    ) -> None:
        """A session on SQLite stores the turn with its items; the next session of the
        thread sends the reasoning and the call verbatim."""
        from tinyctx import SqliteStore

        server.add(
            json_reply(responses_body([THOUGHT, CALL], usage=(40, 30, 0, 20))),
            json_reply(responses_body([message_item("Found it.")])),
            json_reply(responses_body([message_item("Bye.")])),
        )
        search = FakeTool("search", returns="tinyctx manages context", parameters=SEARCH_SCHEMA)
        agent = Agent(OpenAIResponsesModel("gpt-5", client=client), tools=[search.tool])
        store = SqliteStore(tmp_path / "threads.db")
        try:
            async with Session(agent, thread_id="r", store=store) as session:
                await session.run("What is tinyctx?")
                before = session.conversation_messages
            async with Session(agent, thread_id="r", store=store) as session:
                assert session.conversation_messages == before
                await session.run("Bye")
        finally:
            await store.aclose()
        third = server.requests[2].json()["input"]
        assert third[1:3] == [THOUGHT, CALL]


class TestStreaming:
    """Streamed responses emit deltas and end as the same message as a plain call."""

    async def test_text_and_call_deltas_then_the_completed_response(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """Text pieces and argument pieces are emitted; the message is the completed one."""
        output = [THOUGHT, message_item("Let me look."), CALL]
        server.add(
            sse_reply(
                responses_stream(
                    output,
                    text_pieces=["Let me ", "look."],
                    argument_pieces=[['{"q": ', '"tinyctx"}']],
                )
            ),
            json_reply(responses_body(output)),
        )
        model = OpenAIResponsesModel("gpt-5", client=client, stream=True)
        ctx = RunContext.new()
        with capture_events() as events:
            streamed = await model(ask(), ctx)
        plain = await model(ask(settings={"stream": False}), RunContext.new())
        deltas = [e for e in events if isinstance(e, ModelStreamDelta)]
        assert "".join(d.text or "" for d in deltas) == "Let me look."
        assert "".join(d.arguments_delta for d in deltas) == '{"q": "tinyctx"}'
        assert [d.tool_call_id for d in deltas if d.tool_call_id] == ["call_1"]
        assert streamed.message == plain.message
        assert streamed.usage == plain.usage
        assert server.requests[0].json()["stream"] is True

    async def test_an_error_event_is_a_retryable_provider_error(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """An error event with a server_error code mid-stream is worth another attempt."""
        events = responses_stream(
            [message_item("par")],
            text_pieces=["par"],
            error={"code": "server_error", "message": "The server had an error"},
        )
        server.add(sse_reply(events))
        model = OpenAIResponsesModel("gpt-5", client=client, stream=True)
        with pytest.raises(RetryableProviderError, match="server had an error"):
            await model(ask(), RunContext.new())

    async def test_a_stream_that_stops_early_is_an_error(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A stream that ends before response.completed is a ProviderError, not a message."""
        server.add(sse_reply(responses_stream([message_item("x")], text_pieces=["x"], done=False)))
        with pytest.raises(ProviderError, match="before the response completed"):
            await OpenAIResponsesModel("gpt-5", client=client, stream=True)(ask(), RunContext.new())

    async def test_cancel_closes_the_stream(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A cancel on the first delta ends the run, adds nothing and closes the response."""
        events = responses_stream(
            [message_item("partial answer")], text_pieces=["partial ", "answer"], done=False
        )
        server.add(sse_reply(events, hold=True))
        agent = Agent(OpenAIResponsesModel("gpt-5", client=client, stream=True))
        async with Session(agent) as session:

            def stop_on_first_delta(event: Event) -> None:
                if isinstance(event, ModelStreamDelta):
                    session.cancel("stop")

            session.ctx.events.subscribe(stop_on_first_delta)
            with pytest.raises(RunCancelled) as caught:
                await session.run("go")
            assert session.conversation_messages == (UserMessage("go"),)
        assert caught.value.checkpoint == "model_stream"
        assert await server.wait_client_closed()


class TestToolsAndParts:
    """Server tools, images and files take the Responses API's own shapes."""

    async def test_server_tools_go_as_tools_and_their_calls_come_back(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """web_search and file_search are tools; a web_search_call item is kept and resent."""
        searched = {
            "id": "ws_1",
            "type": "web_search_call",
            "status": "completed",
            "action": {"type": "search", "query": "otel"},
        }
        server.add(
            json_reply(responses_body([searched, message_item("OTel is tracing.")])),
            json_reply(responses_body([message_item("Sure.")])),
        )
        model = OpenAIResponsesModel("gpt-5", client=client)
        agent = Agent(
            model,
            server_tools=[
                ServerTool("web_search"),
                ServerTool("file_search", {"vector_store_ids": ["vs_1"]}),
            ],
        )
        async with Session(agent) as session:
            await session.run("What is OTel?")
            await session.run("Thanks")
        first, second = (r.json() for r in server.requests)
        assert first["tools"] == [
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": ["vs_1"]},
        ]
        assert second["input"][1]["type"] == "web_search_call"
        assert second["input"][1] == searched

    async def test_images_and_files_are_input_parts_in_messages_and_outputs(
        self, client: openai.AsyncOpenAI
    ) -> None:
        """A user image is input_image; a tool result's image is in its output list."""
        call = ToolCall("call_9", "shot", {})
        messages = (
            UserMessage((TextPart("look"), PNG)),
            AssistantMessage("", (call,)),
            ToolResult.for_call(call, (TextPart("here"), PNG)),
        )
        params = OpenAIResponsesModel("gpt-5", client=client).request_params(ModelRequest(messages))
        image = {"type": "input_image", "image_url": PNG.data_url, "detail": "auto"}
        assert params["input"][0]["content"] == [{"type": "input_text", "text": "look"}, image]
        assert params["input"][2]["output"] == [{"type": "input_text", "text": "here"}, image]

    async def test_a_client_run_item_is_refused(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A computer_call output item is a ProviderError naming it, not a silent drop."""
        item = {
            "id": "cu_1",
            "type": "computer_call",
            "call_id": "c",
            "status": "completed",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
        }
        server.add(json_reply(responses_body([item])))
        with pytest.raises(ProviderError, match="computer_call"):
            await OpenAIResponsesModel("gpt-5", client=client)(ask(), RunContext.new())


class TestChain:
    """previous_response_id mode sends only what the server does not hold."""

    async def test_chain_sends_the_new_items_and_the_previous_id(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """The second call names the first response and sends only the new user message."""
        server.add(
            json_reply(responses_body([message_item("one")], response_id="resp_a")),
            json_reply(responses_body([message_item("two")], response_id="resp_b")),
        )
        agent = Agent(OpenAIResponsesModel("gpt-5", client=client, store=True, chain=True))
        async with Session(agent) as session:
            await session.run("first")
            await session.run("second")
        first, second = (r.json() for r in server.requests)
        assert first["store"] is True and "previous_response_id" not in first
        assert "include" not in first
        assert second["previous_response_id"] == "resp_a"
        assert second["input"] == [{"type": "message", "role": "user", "content": "second"}]

    async def test_chain_needs_store(self, client: openai.AsyncOpenAI) -> None:
        """chain=True without store=True is a ConfigError naming chain."""
        with pytest.raises(ConfigError, match="chain"):
            OpenAIResponsesModel("gpt-5", client=client, chain=True)

    async def test_a_setting_the_sdk_does_not_take_is_refused(
        self, client: openai.AsyncOpenAI
    ) -> None:
        """An unknown keyword, or one the adapter builds, is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="temprature"):
            OpenAIResponsesModel("gpt-5", client=client, temprature=0.1)
        with pytest.raises(ConfigError, match="input"):
            OpenAIResponsesModel("gpt-5", client=client, input=[])


class TestErrors:
    """SDK errors become tinyctx's provider errors, retryable or not."""

    async def test_rate_limit_is_retryable_with_retry_after(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A 429 is a RetryableProviderError carrying the retry-after seconds."""
        body = openai_error_body("Rate limit reached", type="requests", code="rate_limit_exceeded")
        server.add(error_reply(body, 429, {"retry-after": "2"}))
        with pytest.raises(RetryableProviderError) as caught:
            await OpenAIResponsesModel("gpt-5", client=client)(ask(), RunContext.new())
        assert caught.value.retry_after == 2.0 and caught.value.status == 429

    async def test_overflow_is_context_limit_exceeded(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A context_length_exceeded 400 is ContextLimitExceeded, so a guard can compact."""
        body = openai_error_body(
            "Your input exceeds the context window of this model.",
            type="invalid_request_error",
            code="context_length_exceeded",
        )
        server.add(error_reply(body, 400))
        with pytest.raises(ContextLimitExceeded):
            await OpenAIResponsesModel("gpt-5", client=client)(ask(), RunContext.new())

    async def test_bad_request_is_final_and_a_drop_is_retryable(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """A 401 is a final ProviderError; a dropped connection is retryable."""
        server.add(
            error_reply(openai_error_body("bad key", type="invalid_request_error"), 401),
            drop_connection(),
        )
        model = OpenAIResponsesModel("gpt-5", client=client)
        with pytest.raises(ProviderError) as caught:
            await model(ask(), RunContext.new())
        assert not isinstance(caught.value, RetryableProviderError)
        with pytest.raises(RetryableProviderError, match="connection"):
            await model(ask(), RunContext.new())

    async def test_a_failed_response_is_classified_by_its_code(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """status=failed with a rate_limit_exceeded error is retryable."""
        error = {"code": "rate_limit_exceeded", "message": "slow down"}
        server.add(json_reply(responses_body([], status="failed", error=error)))
        with pytest.raises(RetryableProviderError, match="slow down"):
            await OpenAIResponsesModel("gpt-5", client=client)(ask(), RunContext.new())


class TestAcrossProviders:
    """A fallback between Anthropic and the Responses API keeps the thread valid for both."""

    async def test_anthropic_to_responses_and_back(
        self, client: openai.AsyncOpenAI, server: LoopbackServer
    ) -> None:
        """Anthropic's thinking turn goes to Responses as a plain call; Responses' reasoning
        turn goes back to Anthropic as plain text; pairing holds in every request."""
        from tests.loopback import anthropic_client, anthropic_error_body, anthropic_message
        from tinyctx.middleware import Fallback
        from tinyctx.providers import AnthropicModel

        thinking = {"type": "thinking", "thinking": "search first", "signature": "sig"}
        tool_use = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "a"}}
        overloaded = anthropic_error_body("Overloaded", type="overloaded_error")
        server.add(
            json_reply(anthropic_message([thinking, tool_use])),
            error_reply(overloaded, 529),
            json_reply(responses_body([THOUGHT, message_item("It is a.")])),
            json_reply(anthropic_message([{"type": "text", "text": "You are welcome."}])),
        )
        search = FakeTool("search", returns="a", parameters=SEARCH_SCHEMA)
        async with anthropic_client(server) as claude:
            agent = Agent(
                AnthropicModel("claude-sonnet-4-6", client=claude),
                tools=[search.tool],
                middleware=[Fallback(OpenAIResponsesModel("gpt-5", client=client))],
            )
            async with Session(agent) as session:
                first = await session.run("What is a?")
                second = await session.run("Thanks")
                history = session.conversation_messages
        assert (first.final_text, second.final_text) == ("It is a.", "You are welcome.")
        check_pairing(history, allow_pending=False)
        responses_request = server.requests[2].json()
        assert responses_request["input"][1:] == [
            {
                "type": "function_call",
                "call_id": "toolu_1",
                "name": "search",
                "arguments": '{"q": "a"}',
            },
            {"type": "function_call_output", "call_id": "toolu_1", "output": "a"},
        ]
        last = server.requests[3].json()["messages"]
        assert last[3] == {"role": "assistant", "content": [{"type": "text", "text": "It is a."}]}
        assert [r.path for r in server.requests] == [
            "/v1/messages",
            "/v1/messages",
            "/v1/responses",
            "/v1/messages",
        ]


class TestReasoningUsage:
    """Reasoning tokens are part of Usage: added, subtracted and stored like the others."""

    @given(
        st.integers(0, 10_000),
        st.integers(0, 10_000),
        st.integers(0, 10_000),
        st.integers(0, 10_000),
    )
    def test_reasoning_tokens_survive_the_codec_and_arithmetic(
        self, given_in: int, produced: int, cached: int, reasoning: int
    ) -> None:
        """decode(encode(u)) == u; (u + v) - v == u for reasoning tokens too."""
        usage = Usage(given_in, produced, cached, reasoning_tokens=reasoning)
        assert decode(encode(usage), Usage) == usage
        other = Usage(1, 2, 0, reasoning_tokens=3)
        assert (usage + other).reasoning_tokens == reasoning + 3
        assert ((usage + other) - other).reasoning_tokens == reasoning

    def test_a_document_without_reasoning_tokens_reads_as_zero(self) -> None:
        """Usage stored before the field existed decodes with reasoning_tokens=0, and a
        usage without reasoning writes no such key."""
        old = '{"v":1,"input_tokens":5,"output_tokens":2,"cached_tokens":0}'
        assert decode(old, Usage) == Usage(5, 2, 0)
        assert "reasoning_tokens" not in encode(Usage(5, 2, 0))
        with pytest.raises(CodecError, match="reasoning_tokens"):
            decode(old[:-1] + ',"reasoning_tokens":-1}', Usage)
