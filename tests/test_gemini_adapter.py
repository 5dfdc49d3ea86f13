"""GeminiModel drives the real google-genai SDK against a loopback Gemini API server."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from google import genai

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    drop_connection,
    error_reply,
    json_reply,
    sse_reply,
)
from tests.loopback_wire import close_gemini, gemini_body, gemini_client, gemini_stream
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
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.events import ModelStreamDelta
from tinyctx.messages import check_pairing
from tinyctx.providers.gemini import GeminiModel
from tinyctx.testing import FakeTool, capture_events
from tinyctx.tokens import HeuristicCounter
from tinyctx.tools import ServerTool

# under trio, a cancelled stream leaves the SDK's chain of async generators for trio to
# finalize (the HTTP response itself is closed: the cancel test checks the server sees it)
GENAI_ASYNCGEN_WARNING = (
    r"ignore:Async generator 'google\.genai\.[^']*' was garbage collected before it had been "
    r"exhausted:ResourceWarning"
)
pytestmark = [
    pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING),
    pytest.mark.filterwarnings(GENAI_ASYNCGEN_WARNING),
]

SEARCH_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
PNG_DATA = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9Q"
    "DwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG = ImagePart(PNG_DATA, "image/png")
SIGNATURE = base64.b64encode(b"opaque-thought-signature").decode()
PATH = "/v1/models/gemini-2.5-flash:generateContent"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[genai.Client]:
    sdk_client = gemini_client(server)
    yield sdk_client
    await close_gemini(sdk_client)


def ask(text: str = "hi", **changes: Any) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(text),), **changes)


def call_part(name: str, args: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    return {"functionCall": call, "thoughtSignature": SIGNATURE}


class TestToolUsingRun:
    """A tool-using run: contents, function calls and responses, usage."""

    async def test_call_and_response_go_back_with_the_thought_signature(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """The second request sends the model's part verbatim and the function response."""
        server.add(
            json_reply(
                gemini_body(
                    [
                        {"text": "thinking...", "thought": True},
                        call_part("search", {"q": "tinyctx"}),
                    ],
                    usage=(30, 8, 10, 12),
                )
            ),
            json_reply(gemini_body([{"text": "Found it."}], usage=(60, 4, 30, 0))),
        )
        search = FakeTool("search", returns="tinyctx manages context", parameters=SEARCH_SCHEMA)
        model = GeminiModel("gemini-2.5-flash", client=client, temperature=0.2)
        agent = Agent(model, tools=[search.tool], system_prompt="Be brief.")
        async with Session(agent) as session:
            result = await session.run("What is tinyctx?")
            history = session.conversation_messages

        assert result.final_text == "Found it."
        assert search.calls == [{"q": "tinyctx"}]
        assert result.usage == Usage(90, 24, 40, reasoning_tokens=12)
        assert [r.path for r in server.requests] == [PATH] * 2
        first, second = (r.json() for r in server.requests)
        assert first["systemInstruction"]["parts"] == [{"text": "Be brief."}]
        assert first["generationConfig"]["temperature"] == 0.2
        assert first["contents"] == [{"role": "user", "parts": [{"text": "What is tinyctx?"}]}]
        (declaration,) = first["tools"][0]["functionDeclarations"]
        assert declaration["name"] == "search"
        # the SDK sends this field as named (the API reads proto field names either way)
        assert declaration["parameters_json_schema"] == SEARCH_SCHEMA
        model_turn, results = second["contents"][1:]
        assert model_turn["role"] == "model"
        assert model_turn["parts"][1] == call_part("search", {"q": "tinyctx"})
        (response,) = results["parts"]
        assert response == {
            "functionResponse": {
                "name": "search",
                "response": {"output": "tinyctx manages context"},
            }
        }
        check_pairing(history, allow_pending=False)
        turn = history[1]
        assert isinstance(turn, AssistantMessage) and turn.tool_calls[0].name == "search"

    async def test_ids_the_model_sent_are_kept_both_ways(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A call with an id keeps it; its function response names it; errors say error."""
        server.add(json_reply(gemini_body([call_part("save", {}, "fc_7")])))
        response = await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
        (call,) = response.message.tool_calls
        assert call.id == "fc_7"
        result = ToolResult.for_call(call, "disk full", is_error=True)
        request = ModelRequest((UserMessage("hi"), response.message, result))
        params = GeminiModel("gemini-2.5-flash", client=client).request_params(request)
        assert params["contents"][2]["parts"] == [
            {
                "function_response": {
                    "name": "save",
                    "response": {"error": "disk full"},
                    "id": "fc_7",
                }
            }
        ]

    async def test_the_response_tells_what_the_call_was(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """Provider gcp.gemini, requested and answered models, id and finish reason."""
        server.add(json_reply(gemini_body([{"text": "ok"}], finish="MAX_TOKENS")))
        model = GeminiModel("gemini-2.5-flash", client=client, max_output_tokens=32)
        response = await model(ask(), RunContext.new())
        info = response.info
        assert info is not None
        assert (info.provider, info.request_model, response.model) == (
            "gcp.gemini",
            "gemini-2.5-flash",
            "gemini-2.5-flash-001",
        )
        assert (info.max_tokens, info.response_id, info.finish_reasons) == (
            32,
            "gem-resp-1",
            ("MAX_TOKENS",),
        )
        assert info.server_address == "127.0.0.1"

    async def test_arguments_a_thread_cannot_keep_are_that_calls_error(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """Arguments nested past the codec's limit give the call an error result; the run
        goes on to its answer and the tool never runs."""
        deep: dict[str, Any] = {}
        for _ in range(150):
            deep = {"d": deep}
        server.add(
            json_reply(gemini_body([call_part("search", {"q": deep})])),
            json_reply(gemini_body([{"text": "Sorry."}])),
        )
        search = FakeTool("search", returns="never", parameters=SEARCH_SCHEMA)
        agent = Agent(GeminiModel("gemini-2.5-flash", client=client), tools=[search.tool])
        async with Session(agent) as session:
            result = await session.run("Search deeply.")
            history = session.conversation_messages
        assert result.final_text == "Sorry."
        assert search.calls == []
        check_pairing(history, allow_pending=False)
        answered = [m for m in history if isinstance(m, ToolResult)]
        assert len(answered) == 1 and answered[0].is_error

    async def test_thoughts_are_counted_with_their_turn(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """The thinking a signed turn carries counts toward the budget."""
        server.add(json_reply(gemini_body([call_part("f", {})], usage=(5, 3, 0, 40))))
        response = await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
        counter = HeuristicCounter()
        bare = AssistantMessage("", response.message.tool_calls)
        assert counter.count_message(response.message) == counter.count_message(bare) + 40


class TestContents:
    """System messages, images and tool-result media take Gemini's shapes."""

    async def test_system_messages_images_and_result_media(self, client: genai.Client) -> None:
        """System text joins the instruction; images are inline_data, in results too."""
        call = ToolCall("call_1", "shot", {})
        messages = (
            SystemMessage("Use tools."),
            UserMessage((TextPart("look"), PNG)),
            AssistantMessage("", (call,)),
            ToolResult.for_call(call, (TextPart("here"), PNG)),
        )
        request = ModelRequest(messages, system_prompt="Be brief.")
        params = GeminiModel("gemini-2.5-flash", client=client).request_params(request)
        assert params["config"]["system_instruction"] == "Be brief.\n\nUse tools."
        image = {"inline_data": {"mime_type": "image/png", "data": PNG_DATA}}
        assert params["contents"][0]["parts"] == [{"text": "look"}, image]
        (result,) = params["contents"][2]["parts"]
        assert result["function_response"]["response"] == {"output": "here"}
        assert result["function_response"]["parts"] == [image]

    async def test_server_tools_and_unknown_settings(self, client: genai.Client) -> None:
        """A server tool is a Gemini tool by its type; an unknown setting is refused."""
        request = ask(server_tools=(ServerTool("google_search"),))
        params = GeminiModel("gemini-2.5-flash", client=client).request_params(request)
        assert params["config"]["tools"] == [{"google_search": {}}]
        with pytest.raises(ConfigError, match="temprature"):
            GeminiModel("gemini-2.5-flash", client=client, temprature=0.1)
        with pytest.raises(ConfigError, match="tools"):
            GeminiModel("gemini-2.5-flash", client=client, tools=[])

    async def test_an_edited_turn_keeps_its_thoughts_first(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A turn a layer rewrote sends its thought parts, then the new text."""
        server.add(
            json_reply(gemini_body([{"text": "hmm", "thought": True}, {"text": "long answer"}]))
        )
        response = await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
        edited = response.message.evolve(content="[short]")
        params = GeminiModel("gemini-2.5-flash", client=client).request_params(
            ModelRequest((UserMessage("hi"), edited))
        )
        assert params["contents"][1]["parts"] == [
            {"text": "hmm", "thought": True},
            {"text": "[short]"},
        ]


class TestStreaming:
    """Streamed answers emit deltas and end as the same message as a plain call."""

    async def test_text_pieces_and_a_call_then_the_same_message(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """Each chunk's text is a delta; the call arrives whole; the message matches."""
        chunks = [
            [{"text": "Let me "}],
            [{"text": "look."}],
            [call_part("search", {"q": "x"}, "fc_1")],
        ]
        server.add(
            sse_reply(gemini_stream(chunks, usage=(10, 5, 0, 0))),
            json_reply(
                gemini_body(
                    [{"text": "Let me look."}, call_part("search", {"q": "x"}, "fc_1")],
                    usage=(10, 5, 0, 0),
                )
            ),
        )
        model = GeminiModel("gemini-2.5-flash", client=client, stream=True)
        with capture_events() as events:
            streamed = await model(ask(), RunContext.new())
        plain = await model(ask(settings={"stream": False}), RunContext.new())
        deltas = [e for e in events if isinstance(e, ModelStreamDelta)]
        assert "".join(d.text or "" for d in deltas) == "Let me look."
        assert [
            (d.tool_call_id, d.tool_name, d.arguments_delta) for d in deltas if d.tool_name
        ] == [("fc_1", "search", '{"q": "x"}')]
        assert streamed.message == plain.message
        assert streamed.usage == plain.usage == Usage(10, 5, 0)
        assert server.requests[0].path.endswith(":streamGenerateContent?alt=sse")

    async def test_cancel_closes_the_stream(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A cancel on the first delta ends the run and closes the HTTP response."""
        server.add(
            sse_reply(gemini_stream([[{"text": "partial "}], [{"text": "answer"}]]), hold=True)
        )
        agent = Agent(GeminiModel("gemini-2.5-flash", client=client, stream=True))
        async with Session(agent) as session:

            def stop_on_first_delta(event: Event) -> None:
                if isinstance(event, ModelStreamDelta):
                    session.cancel("stop")

            session.ctx.events.subscribe(stop_on_first_delta)
            with pytest.raises(RunCancelled):
                await session.run("go")
            assert session.conversation_messages == (UserMessage("go"),)
        assert await server.wait_client_closed()


class TestErrors:
    """SDK errors become tinyctx's provider errors, retryable or not."""

    async def test_resource_exhausted_is_retryable(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A 429 RESOURCE_EXHAUSTED is retryable with its retry-after."""
        body = {"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}
        server.add(error_reply(body, 429, {"retry-after": "4"}))
        with pytest.raises(RetryableProviderError) as caught:
            await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
        assert (caught.value.status, caught.value.retry_after) == (429, 4.0)

    async def test_an_oversized_prompt_is_context_limit_exceeded(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """Gemini's input-token-count 400 is ContextLimitExceeded with its numbers."""
        message = (
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576)."
        )
        body = {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
        server.add(error_reply(body, 400))
        with pytest.raises(ContextLimitExceeded) as caught:
            await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
        assert (caught.value.estimate, caught.value.window) == (1200000, 1048576)

    async def test_a_bad_key_is_final_and_a_drop_is_retryable(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A 403 is a final ProviderError; a dropped connection is retryable."""
        body = {
            "error": {"code": 403, "message": "API key not valid", "status": "PERMISSION_DENIED"}
        }
        server.add(error_reply(body, 403), drop_connection())
        model = GeminiModel("gemini-2.5-flash", client=client)
        with pytest.raises(ProviderError) as caught:
            await model(ask(), RunContext.new())
        assert not isinstance(caught.value, RetryableProviderError)
        with pytest.raises(RetryableProviderError):
            await model(ask(), RunContext.new())

    async def test_a_server_error_is_retryable(
        self, server: LoopbackServer, client: genai.Client
    ) -> None:
        """A 503 UNAVAILABLE is worth another attempt."""
        body = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
        server.add(error_reply(body, 503))
        with pytest.raises(RetryableProviderError, match="overloaded"):
            await GeminiModel("gemini-2.5-flash", client=client)(ask(), RunContext.new())
