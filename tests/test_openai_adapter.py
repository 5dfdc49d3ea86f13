"""OpenAIChatModel drives the real OpenAI SDK against a loopback chat-completions server."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    drop_connection,
    error_reply,
    hang_up_on_client,
    json_reply,
    openai_client,
    openai_completion,
    openai_error_body,
    openai_stream,
    run_cancelled_once_sent,
    sse_reply,
)
from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    ContextLimitExceeded,
    Event,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ProviderError,
    RetryableProviderError,
    RunCancelled,
    RunContext,
    Session,
    SystemMessage,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.events import ModelStreamDelta
from tinyctx.messages import check_pairing
from tinyctx.providers import OpenAIChatModel
from tinyctx.testing import FakeTool, capture_events
from tinyctx.tools import ServerTool, ToolSpec

# Under trio, the SDK's and httpx's async generators that a stream leaves unexhausted (the
# OpenAI SDK stops reading at [DONE]; a cancel stops mid-stream) are finalized by trio with a
# ResourceWarning each. The response itself is closed (the tests check the server sees it).
pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}},
    "required": ["q"],
}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(server) as sdk_client:
        yield sdk_client


def ctx() -> RunContext[None]:
    return RunContext.new()


def ask(text: str = "hi", **changes: Any) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(text),), **changes)


class TestToolUsingRun:
    """A tool-using run goes through Agent and Session, the real SDK and back."""

    async def test_tool_call_runs_and_its_result_goes_back_to_the_model(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(
            json_reply(
                openai_completion(
                    None, [("call_1", "search", '{"q": "tinyctx"}')], usage=(20, 7, 4)
                )
            ),
            json_reply(openai_completion("Found it.", usage=(40, 6, 16))),
        )
        search = FakeTool("search", returns="tinyctx manages context", parameters=SEARCH_SCHEMA)
        model = OpenAIChatModel("gpt-4o", client=client, temperature=0.0)
        agent = Agent(model, tools=[search.tool], system_prompt="Be brief.")
        async with Session(agent) as session:
            result = await session.run("What is tinyctx?")
            history = session.conversation_messages

        assert result.final_text == "Found it."
        assert search.calls == [{"q": "tinyctx"}]
        assert result.usage == Usage(60, 13, 20)
        assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 2
        first, second = (r.json() for r in server.requests)
        assert first["model"] == "gpt-4o"
        assert first["temperature"] == 0.0
        assert "stream" not in first
        assert first["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is tinyctx?"},
        ]
        assert first["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "parameters": SEARCH_SCHEMA,
                    "description": "fake tool search",
                },
            }
        ]
        assert second["messages"][2:] == [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "tinyctx"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "tinyctx manages context"},
        ]
        assert history == (
            UserMessage("What is tinyctx?"),
            AssistantMessage("", (ToolCall("call_1", "search", {"q": "tinyctx"}),)),
            ToolResult("call_1", "tinyctx manages context", "search"),
            AssistantMessage("Found it."),
        )
        check_pairing(history, allow_pending=False)

    async def test_usage_and_the_served_model_name_are_reported(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(json_reply(openai_completion("hello", usage=(120, 9, 64))))
        response = await OpenAIChatModel("gpt-4o", client=client)(ask(), ctx())
        assert response.usage == Usage(120, 9, 64)
        assert response.model == "gpt-4o-2024-08-06"
        assert response.message == AssistantMessage("hello")
        assert response.raw.id == "chatcmpl-loopback"

    async def test_the_request_model_wins_and_request_settings_override_the_adapter(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(json_reply(openai_completion("ok")))
        model = OpenAIChatModel("gpt-4o", client=client, temperature=0.2, seed=7)
        await model(ask(model="gpt-4o-mini", settings={"temperature": 0.9}), ctx())
        body = server.requests[0].json()
        assert (body["model"], body["temperature"], body["seed"]) == ("gpt-4o-mini", 0.9, 7)

    async def test_server_tools_pass_through_as_the_api_expects(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(json_reply(openai_completion("ok")))
        request = ask(
            tools=(ToolSpec("search", "", SEARCH_SCHEMA),),
            server_tools=(
                ServerTool("web_search", {"search_context_size": "low"}),
                ServerTool("custom", {"custom": {"name": "sql", "description": "SQL query"}}),
            ),
        )
        await OpenAIChatModel("gpt-4o", client=client)(request, ctx())
        body = server.requests[0].json()
        assert body["web_search_options"] == {"search_context_size": "low"}
        assert body["tools"] == [
            {"type": "function", "function": {"name": "search", "parameters": SEARCH_SCHEMA}},
            {"type": "custom", "custom": {"name": "sql", "description": "SQL query"}},
        ]

    async def test_compatible_servers_reasoning_refusals_and_missing_ids_are_handled(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        reasoning = openai_completion("42", extra={"reasoning_content": "6 times 7"})
        refusal = openai_completion(None, extra={"refusal": "I can't help with that."})
        no_id = openai_completion(None, [("", "search", "")])
        no_usage = {**openai_completion("plain"), "usage": None}
        server.add(
            json_reply(reasoning), json_reply(refusal), json_reply(no_id), json_reply(no_usage)
        )
        model = OpenAIChatModel("deepseek-reasoner", client=client)

        thought = await model(ask(), ctx())
        assert thought.message.content == "42"
        assert thought.message.metadata["openai"] == {"reasoning_content": "6 times 7"}
        refused = await model(ask(), ctx())
        assert refused.text == "I can't help with that."
        assert refused.message.metadata["openai"]["refusal"] == "I can't help with that."
        (call,) = (await model(ask(), ctx())).message.tool_calls
        assert call.id.startswith("call_")
        assert (call.name, call.arguments, call.invalid_arguments) == ("search", {}, None)
        assert (await model(ask(), ctx())).usage is None

        # nothing local reaches the API when that history goes back
        server.add(json_reply(openai_completion("ok")))
        await model(ModelRequest((UserMessage("q"), thought.message, UserMessage("and?"))), ctx())
        sent = server.requests[-1].json()["messages"]
        assert sent[1] == {"role": "assistant", "content": "42"}


class TestOneIdTwice:
    """Two tool calls of one response under one id: the same call repeated runs once;
    different calls both run, the later under a fresh id (never a ProviderError)."""

    @pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
    async def test_the_same_call_twice_runs_once(
        self, stream: bool, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """An identical repeat is dropped: one call, one result, the run completes."""
        calls = [("call_1", "search", '{"q": "a"}')] * 2
        if stream:
            server.add(sse_reply(openai_stream([], [(i, n, [a]) for i, n, a in calls])))
            server.add(sse_reply(openai_stream(["done"])))
        else:
            server.add(json_reply(openai_completion(None, calls)))
            server.add(json_reply(openai_completion("done")))
        search = FakeTool("search", returns="A", parameters=SEARCH_SCHEMA)
        agent = Agent(OpenAIChatModel("gpt-4o", client=client, stream=stream), tools=[search.tool])
        async with Session(agent) as session:
            result = await session.run("go")
            history = session.conversation_messages
        assert result.final_text == "done"
        assert search.calls == [{"q": "a"}]
        assert history[1] == AssistantMessage("", (ToolCall("call_1", "search", {"q": "a"}),))
        check_pairing(history, allow_pending=False)

    async def test_different_calls_under_one_id_both_run(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """The later call gets a fresh call_ id; each result answers its own call."""
        server.add(
            json_reply(
                openai_completion(
                    None, [("call_1", "search", '{"q": "a"}'), ("call_1", "search", '{"q": "b"}')]
                )
            ),
            json_reply(openai_completion("done")),
        )
        search = FakeTool("search", returns=lambda arguments: arguments["q"].upper())
        agent = Agent(OpenAIChatModel("gpt-4o", client=client), tools=[search.tool])
        async with Session(agent) as session:
            result = await session.run("go")
            history = session.conversation_messages
        assert result.final_text == "done"
        assert search.calls == [{"q": "a"}, {"q": "b"}]
        first, second = history[1].tool_calls  # type: ignore[attr-defined]
        assert first.id == "call_1" and second.id.startswith("call_") and second.id != "call_1"
        answers = {m.tool_call_id: m.text for m in history if isinstance(m, ToolResult)}
        assert answers == {"call_1": "A", second.id: "B"}
        check_pairing(history, allow_pending=False)
        sent = server.requests[1].json()["messages"]
        assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_1", second.id]


class TestStreaming:
    """stream=True emits text and tool-call deltas as events and assembles the response."""

    async def test_deltas_are_events_and_the_response_is_assembled(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        stream = openai_stream(
            ["Let me ", "search."],
            [("call_9", "search", ['{"q": ', '"x"}'])],
            usage=(30, 9, 8),
        )
        server.add(sse_reply(stream))
        model = OpenAIChatModel("gpt-4o", client=client, stream=True)
        with capture_events() as events:
            response = await model(ask(), ctx())

        deltas = [e for e in events if isinstance(e, ModelStreamDelta)]
        assert [
            (d.text, d.tool_call_index, d.tool_call_id, d.tool_name, d.arguments_delta)
            for d in deltas
        ] == [
            ("Let me ", None, None, None, ""),
            ("search.", None, None, None, ""),
            ("", 0, "call_9", "search", ""),
            ("", 0, None, None, '{"q": '),
            ("", 0, None, None, '"x"}'),
        ]
        assert response.message == AssistantMessage(
            "Let me search.", (ToolCall("call_9", "search", {"q": "x"}),)
        )
        assert response.usage == Usage(30, 9, 8)
        assert response.model == "gpt-4o-2024-08-06"
        body = server.requests[0].json()
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}

    async def test_a_streamed_tool_run_end_to_end(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(
            sse_reply(openai_stream([], [("call_1", "search", ['{"q":', ' "a"}'])])),
            sse_reply(openai_stream(["Done", "."], usage=(50, 2, 0))),
        )
        search = FakeTool("search", returns="A", parameters=SEARCH_SCHEMA)
        agent = Agent(OpenAIChatModel("gpt-4o", client=client, stream=True), tools=[search.tool])
        with capture_events() as events:
            async with Session(agent) as session:
                result = await session.run("go")
        assert result.final_text == "Done."
        assert search.calls == [{"q": "a"}]
        assert result.usage == Usage(62, 7, 0)
        texts = [e.text for e in events if isinstance(e, ModelStreamDelta) and e.text]
        assert texts == ["Done", "."]

    async def test_the_request_can_switch_streaming_on(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(sse_reply(openai_stream(["streamed"])))
        response = await OpenAIChatModel("gpt-4o", client=client)(
            ask(settings={"stream": True}), ctx()
        )
        assert response.text == "streamed"
        assert server.requests[0].json()["stream"] is True

    async def test_compatible_servers_streams_without_usage_or_call_indices(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        whole_call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        events = [
            *openai_stream(["ok"], usage=None)[:-2],
            (
                None,
                {
                    **openai_stream()[0][1],
                    "choices": [
                        {"index": 0, "delta": {"tool_calls": [whole_call]}, "finish_reason": None}
                    ],
                },
            ),
            (None, "[DONE]"),
        ]
        server.add(sse_reply(events))
        response = await OpenAIChatModel("llama3", client=client, stream=True)(ask(), ctx())
        assert response.message == AssistantMessage("ok", (ToolCall("c1", "f"),))
        assert response.usage is None

    async def test_an_error_event_inside_the_stream_is_a_provider_error(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        events = [
            *openai_stream(["par"], done=False),
            (None, {"error": {"message": "overloaded", "type": "server_error"}}),
        ]
        server.add(sse_reply(events))
        with pytest.raises(RetryableProviderError, match="overloaded"):
            await OpenAIChatModel("gpt-4o", client=client, stream=True)(ask(), ctx())


class TestCancellation:
    """A cancel drops the stream, closes the HTTP response and ends the run with nothing added."""

    async def test_cancel_mid_stream_closes_the_connection_and_appends_nothing(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(sse_reply(openai_stream(["partial ", "answer"], done=False), hold=True))
        agent = Agent(OpenAIChatModel("gpt-4o", client=client, stream=True))
        seen: list[Event] = []
        async with Session(agent) as session:

            def stop_on_first_delta(event: Event) -> None:
                if isinstance(event, ModelStreamDelta):
                    seen.append(event)
                    session.cancel("the user pressed stop")

            session.ctx.events.subscribe(stop_on_first_delta)
            with pytest.raises(RunCancelled) as caught:
                await session.run("tell me everything")
            assert session.conversation_messages == (UserMessage("tell me everything"),)

        assert caught.value.checkpoint == "model_stream"
        assert caught.value.reason == "the user pressed stop"
        assert len(seen) == 1  # nothing after the cancel is read, even if already buffered
        assert await server.wait_client_closed(), "the server never saw the connection close"

    async def test_cancel_while_waiting_for_the_response_closes_the_request(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(hang_up_on_client())
        agent = Agent(OpenAIChatModel("gpt-4o", client=client))
        async with Session(agent) as session:
            cancelled = await run_cancelled_once_sent(session, server, "hello?")
            assert session.conversation_messages == (UserMessage("hello?"),)
        assert (cancelled.checkpoint, cancelled.reason) == ("model_call", "timeout")
        assert await server.wait_client_closed()


class _Recover(Layer):
    """What a budget guard does on a provider overflow: drop the oldest turn and retry."""

    def __init__(self) -> None:
        self.overflows: list[str | None] = []

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        try:
            return await call_next(request, ctx)
        except ContextLimitExceeded as exc:
            self.overflows.append(exc.provider_message)
            return await call_next(request.evolve(messages=request.messages[-1:]), ctx)


class _RetryOnce(Layer):
    """What a Retry layer does with a retryable provider error."""

    def __init__(self) -> None:
        self.waits: list[float | None] = []

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        try:
            return await call_next(request, ctx)
        except RetryableProviderError as exc:
            self.waits.append(exc.retry_after)
            return await call_next(request, ctx)


OVERFLOW = openai_error_body(
    "This model's maximum context length is 8192 tokens. However, your messages resulted in "
    "8227 tokens. Please reduce the length of the messages.",
    type="invalid_request_error",
    code="context_length_exceeded",
)


class TestErrors:
    """Provider errors become tinyctx errors a budget guard or a Retry layer can act on."""

    async def test_context_overflow_is_context_limit_exceeded_with_the_numbers(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(error_reply(OVERFLOW, 400))
        with pytest.raises(ContextLimitExceeded) as caught:
            await OpenAIChatModel("gpt-4o", client=client)(ask(), ctx())
        assert "maximum context length is 8192" in str(caught.value.provider_message)
        assert (caught.value.estimate, caught.value.window) == (8227, 8192)

    @pytest.mark.parametrize(
        ("body", "estimate", "window"),
        [
            (  # vLLM puts the error at the top level
                {
                    "object": "error",
                    "message": "This model's maximum context length is 4096 tokens. However, you "
                    "requested 5000 tokens (4000 in the messages, 1000 in the completion).",
                    "type": "BadRequestError",
                    "code": 400,
                },
                5000,
                4096,
            ),
            (  # llama.cpp names the numbers in fields
                {
                    "error": {
                        "code": 400,
                        "message": "the request exceeds the available context size, try "
                        "increasing it",
                        "type": "exceed_context_size_error",
                        "n_prompt_tokens": 5000,
                        "n_ctx": 4096,
                    }
                },
                5000,
                4096,
            ),
        ],
        ids=["vllm", "llama.cpp"],
    )
    async def test_compatible_servers_overflows_are_recognized(
        self,
        server: LoopbackServer,
        client: openai.AsyncOpenAI,
        body: dict[str, Any],
        estimate: int,
        window: int,
    ) -> None:
        server.add(error_reply(body, 400))
        with pytest.raises(ContextLimitExceeded) as caught:
            await OpenAIChatModel("local", client=client)(ask(), ctx())
        assert (caught.value.estimate, caught.value.window) == (estimate, window)

    async def test_retry_after_as_an_http_date(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        when = email.utils.formatdate(time.time() + 3600, usegmt=True)
        server.add(
            error_reply(openai_error_body("slow", type="requests"), 429, {"retry-after": when})
        )
        with pytest.raises(RetryableProviderError) as caught:
            await OpenAIChatModel("gpt-4o", client=client)(ask(), ctx())
        assert caught.value.retry_after is not None
        assert 3500 < caught.value.retry_after <= 3600

    async def test_a_budget_guard_can_react_to_the_overflow(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(error_reply(OVERFLOW, 400), json_reply(openai_completion("short answer")))
        recover = _Recover()
        agent = Agent(OpenAIChatModel("gpt-4o", client=client), middleware=[recover])
        history = [UserMessage("old " * 50), AssistantMessage("old answer"), UserMessage("new")]
        async with Session(agent) as session:
            result = await session.run(history)
        assert result.final_text == "short answer"
        assert recover.overflows == [OVERFLOW["error"]["message"]]
        assert [len(r.json()["messages"]) for r in server.requests] == [3, 1]

    async def test_rate_limit_is_retryable_with_retry_after_and_a_retry_layer_recovers(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        limited = openai_error_body(
            "Rate limit reached", type="requests", code="rate_limit_exceeded"
        )
        server.add(
            error_reply(limited, 429, {"retry-after": "7"}), json_reply(openai_completion("ok"))
        )
        retry = _RetryOnce()
        agent = Agent(OpenAIChatModel("gpt-4o", client=client), middleware=[retry])
        async with Session(agent) as session:
            result = await session.run("hi")
        assert result.final_text == "ok"
        assert retry.waits == [7.0]

    @pytest.mark.parametrize(
        ("reply", "error", "status", "retry_after"),
        [
            (
                error_reply(openai_error_body("busy", type="server_error"), 500),
                RetryableProviderError,
                500,
                None,
            ),
            (
                error_reply({"error": "unavailable"}, 503, {"retry-after-ms": "1500"}),
                RetryableProviderError,
                503,
                1.5,
            ),
            (
                error_reply(
                    openai_error_body(
                        "bad key", type="invalid_request_error", code="invalid_api_key"
                    ),
                    401,
                ),
                ProviderError,
                401,
                None,
            ),
            (
                error_reply(
                    openai_error_body(
                        "quota", type="insufficient_quota", code="insufficient_quota"
                    ),
                    429,
                ),
                ProviderError,
                429,
                None,
            ),
            (
                error_reply(
                    openai_error_body("no", type="server_error"), 500, {"x-should-retry": "false"}
                ),
                ProviderError,
                500,
                None,
            ),
            (drop_connection(), RetryableProviderError, None, None),
        ],
        ids=[
            "5xx",
            "503-retry-after-ms",
            "auth",
            "quota-is-final",
            "server-says-no-retry",
            "connection",
        ],
    )
    async def test_status_errors_map_to_retryable_or_final(
        self,
        server: LoopbackServer,
        client: openai.AsyncOpenAI,
        reply: Any,
        error: type[ProviderError],
        status: int | None,
        retry_after: float | None,
    ) -> None:
        server.add(reply)
        with pytest.raises(ProviderError) as caught:
            await OpenAIChatModel("gpt-4o", client=client)(ask(), ctx())
        assert type(caught.value) is error
        assert caught.value.status == status
        assert caught.value.provider == "openai"
        if error is RetryableProviderError:
            assert caught.value.retry_after == retry_after  # type: ignore[attr-defined]


class TestConfiguration:
    """Bad configuration fails at construction (or at the call, for request settings)."""

    async def test_unknown_and_adapter_built_settings_are_rejected(
        self, client: openai.AsyncOpenAI
    ) -> None:
        with pytest.raises(ConfigError, match=r"settings\['temprature'\].*temperature"):
            OpenAIChatModel("gpt-4o", client=client, temprature=0.1)
        with pytest.raises(ConfigError, match=r"settings\['messages'\].*builds"):
            OpenAIChatModel("gpt-4o", client=client, messages=[])
        with pytest.raises(ConfigError, match="OpenAIChatModel.model"):
            OpenAIChatModel("", client=client)
        with pytest.raises(ConfigError, match="OpenAIChatModel.stream"):
            OpenAIChatModel("gpt-4o", client=client, stream="yes")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="OpenAIChatModel.client"):
            OpenAIChatModel("gpt-4o", client=object())  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="OpenAIChatModel.base_url"):
            OpenAIChatModel("gpt-4o", client=client, base_url="http://x")

    async def test_a_bad_request_setting_fails_before_anything_is_sent(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        model = OpenAIChatModel("gpt-4o", client=client)
        with pytest.raises(ConfigError, match=r"request.settings\['nope'\]"):
            await model(ask(settings={"nope": 1}), ctx())
        with pytest.raises(ConfigError, match=r"request.settings\['stream'\]"):
            await model(ask(settings={"stream": "yes"}), ctx())
        assert server.requests == []

    async def test_an_owned_client_is_built_from_base_url_and_closed(
        self, server: LoopbackServer
    ) -> None:
        server.add(json_reply(openai_completion("from a compatible server")))
        async with OpenAIChatModel("llama3", base_url=f"{server.url}/v1", api_key="local") as model:
            response = await model(ask(), ctx())
        assert response.text == "from a compatible server"
        assert model.client.is_closed()
        assert json.loads(server.requests[0].body)["model"] == "llama3"

    async def test_system_messages_and_metadata_in_the_history_reach_the_api_cleanly(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        server.add(json_reply(openai_completion("ok")))
        history = (
            SystemMessage("rules", metadata={"source": "policy"}),
            UserMessage("retrieved", essential=False, metadata={"doc": 3}),
            UserMessage("question"),
        )
        await OpenAIChatModel("gpt-4o", client=client)(
            ModelRequest(history, system_prompt="sys"), ctx()
        )
        assert server.requests[0].json()["messages"] == [
            {"role": "system", "content": "sys"},
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "retrieved"},
            {"role": "user", "content": "question"},
        ]
