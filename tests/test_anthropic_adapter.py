"""AnthropicModel drives the real Anthropic SDK against a loopback Messages API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import attrs
import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_error_body,
    anthropic_message,
    anthropic_stream,
    drop_connection,
    error_reply,
    hang_up_on_client,
    json_reply,
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
from tinyctx.messages import check_pairing, tool_turns
from tinyctx.providers import AnthropicModel
from tinyctx.providers.anthropic import DEFAULT_MAX_TOKENS
from tinyctx.testing import FakeTool, capture_events
from tinyctx.tools import ServerTool, ToolSpec

# see tests/test_openai_adapter.py: trio reports the SDK generators a cancelled stream leaves
pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

MODEL = "claude-sonnet-4-6"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic_client(server) as sdk_client:
        yield sdk_client


def ctx() -> RunContext[None]:
    return RunContext.new()


def ask(text: str = "hi", **changes: Any) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(text),), **changes)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


class TestToolUsingRun:
    """A tool-using run goes through Agent and Session, the real SDK and back."""

    async def test_tool_calls_run_and_their_results_go_back_in_one_user_turn(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(
            json_reply(
                anthropic_message(
                    [
                        text("Reading both."),
                        tool_use("toolu_1", "read", {"path": "a.py"}),
                        tool_use("toolu_2", "read", {"path": "missing.py"}),
                    ]
                )
            ),
            json_reply(anthropic_message([text("a.py is fine.")])),
        )

        def read(arguments: Any) -> str:
            if arguments["path"] == "missing.py":
                raise FileNotFoundError("missing.py")
            return "print('a')"

        tool = FakeTool("read", returns=read, parameters=SCHEMA)
        model = AnthropicModel(MODEL, client=client, cache_prefix=False)
        agent = Agent(model, tools=[tool.tool], system_prompt="You review code.")
        async with Session(agent) as session:
            result = await session.run("Check the files.")
            history = session.conversation_messages

        assert result.final_text == "a.py is fine."
        assert result.usage == Usage(24, 10, 0)
        assert [r.path for r in server.requests] == ["/v1/messages"] * 2
        first, second = (r.json() for r in server.requests)
        assert first["model"] == MODEL
        assert first["max_tokens"] == DEFAULT_MAX_TOKENS
        assert first["system"] == [text("You review code.")]
        assert first["messages"] == [{"role": "user", "content": [text("Check the files.")]}]
        assert first["tools"] == [
            {"name": "read", "input_schema": SCHEMA, "description": "fake tool read"}
        ]
        assert second["messages"][1:] == [
            {
                "role": "assistant",
                "content": [
                    text("Reading both."),
                    tool_use("toolu_1", "read", {"path": "a.py"}),
                    tool_use("toolu_2", "read", {"path": "missing.py"}),
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('a')"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "Error (FileNotFoundError): missing.py",
                        "is_error": True,
                    },
                ],
            },
        ]
        check_pairing(history, allow_pending=False)
        assert history[1] == AssistantMessage(
            "Reading both.",
            (
                ToolCall("toolu_1", "read", {"path": "a.py"}),
                ToolCall("toolu_2", "read", {"path": "missing.py"}),
            ),
        )

    async def test_usage_counts_cache_reads_and_writes_as_prompt(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        usage = {
            "input_tokens": 12,
            "output_tokens": 30,
            "cache_creation_input_tokens": 50,
            "cache_read_input_tokens": 1000,
        }
        server.add(json_reply(anthropic_message([text("ok")], usage=usage, model="claude-x-1")))
        response = await AnthropicModel(MODEL, client=client)(ask(), ctx())
        assert response.usage == Usage(1062, 30, 1000)
        assert response.model == "claude-x-1"
        assert response.raw.id == "msg_loopback"

    async def test_thinking_blocks_go_back_unchanged_with_the_tool_turn(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        thinking = {"type": "thinking", "thinking": "Need the file.", "signature": "sig=="}
        server.add(
            json_reply(anthropic_message([thinking, tool_use("toolu_1", "read", {"path": "x"})])),
            json_reply(anthropic_message([text("done")])),
        )
        tool = FakeTool("read", returns="content", parameters=SCHEMA)
        model = AnthropicModel(
            MODEL, client=client, thinking={"type": "enabled", "budget_tokens": 2048}
        )
        async with Session(Agent(model, tools=[tool.tool])) as session:
            await session.run("go")
            assistant = session.conversation_messages[1]
        assert assistant.metadata["anthropic"]["content"][0]["thinking"] == "Need the file."
        second = server.requests[1].json()
        assert second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        sent = second["messages"][1]["content"]
        assert sent[0] == thinking  # a thinking block never carries a cache marker
        assert sent[1]["id"] == "toolu_1"

    async def test_system_messages_server_tools_and_settings(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(json_reply(anthropic_message([text("ok")])))
        request = ModelRequest(
            (SystemMessage("Project rules."), UserMessage("q", essential=False, metadata={"d": 1})),
            tools=(ToolSpec("read", "Read a file.", SCHEMA),),
            server_tools=(
                ServerTool("web_search_20250305", {"name": "web_search", "max_uses": 2}),
            ),
            system_prompt="You are terse.",
            model="claude-haiku-4-5",
            settings={"max_tokens": 256, "stop_sequences": ["END"]},
        )
        model = AnthropicModel(MODEL, client=client, cache_prefix=False, stop_sequences=["STOP"])
        await model(request, ctx())
        body = server.requests[0].json()
        assert body["model"] == "claude-haiku-4-5"
        assert body["max_tokens"] == 256
        assert body["stop_sequences"] == ["END"]
        assert body["system"] == [text("You are terse."), text("Project rules.")]
        assert body["messages"] == [{"role": "user", "content": [text("q")]}]
        assert body["tools"] == [
            {"name": "read", "input_schema": SCHEMA, "description": "Read a file."},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        ]


class TestStreaming:
    """stream=True emits text and tool-call deltas as events and assembles the response."""

    async def test_deltas_are_events_and_the_message_is_assembled(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        events = anthropic_stream(
            [
                ("thinking", ("Plan.", "sig")),
                ("text", ["Let me ", "look."]),
                ("tool_use", ("toolu_7", "read", ['{"path": ', '"x.py"}'])),
            ],
            usage={"cache_read_input_tokens": 100},
            output_tokens=42,
        )
        server.add(sse_reply(events))
        with capture_events() as captured:
            response = await AnthropicModel(MODEL, client=client, stream=True)(ask(), ctx())
        deltas = [e for e in captured if isinstance(e, ModelStreamDelta)]
        assert [
            (d.reasoning, d.text, d.tool_call_index, d.tool_call_id, d.tool_name, d.arguments_delta)
            for d in deltas
        ] == [
            ("Plan.", "", None, None, None, ""),
            ("", "Let me ", None, None, None, ""),
            ("", "look.", None, None, None, ""),
            ("", "", 0, "toolu_7", "read", ""),
            ("", "", 0, None, None, '{"path": '),
            ("", "", 0, None, None, '"x.py"}'),
        ]
        message = response.message
        assert (message.content, message.tool_calls) == (
            "Let me look.",
            (ToolCall("toolu_7", "read", {"path": "x.py"}),),
        )
        assert message.metadata["anthropic"]["content"][0] == {
            "type": "thinking",
            "thinking": "Plan.",
            "signature": "sig",
        }
        assert response.usage == Usage(112, 42, 100)

    async def test_a_streamed_tool_run_end_to_end(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(
            sse_reply(anthropic_stream([("tool_use", ("toolu_1", "read", ['{"path": "a"}']))])),
            sse_reply(anthropic_stream([("text", ["All ", "good."])])),
        )
        tool = FakeTool("read", returns="A", parameters=SCHEMA)
        agent = Agent(AnthropicModel(MODEL, client=client, stream=True), tools=[tool.tool])
        async with Session(agent) as session:
            result = await session.run("go")
        assert result.final_text == "All good."
        assert tool.calls == [{"path": "a"}]
        assert result.usage == Usage(24, 10, 0)

    async def test_tool_input_the_sdk_cannot_parse_is_a_provider_error(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(sse_reply(anthropic_stream([("tool_use", ("toolu_1", "read", ['{"a": ]']))])))
        with pytest.raises(ProviderError, match="anthropic: Unable to parse tool parameter JSON"):
            await AnthropicModel(MODEL, client=client, stream=True)(ask(), ctx())

    async def test_an_overloaded_error_inside_the_stream_is_retryable(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        error = {"type": "overloaded_error", "message": "Overloaded"}
        server.add(sse_reply(anthropic_stream([("text", ["par"])], error=error)))
        with pytest.raises(RetryableProviderError, match="Overloaded") as caught:
            await AnthropicModel(MODEL, client=client, stream=True)(ask(), ctx())
        assert caught.value.status is None


class TestCancellation:
    """A cancel drops the stream, closes the HTTP response and ends the run with nothing added."""

    async def test_cancel_mid_stream_closes_the_connection_and_appends_nothing(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(
            sse_reply(anthropic_stream([("text", ["half an ", "answer"])], done=False), hold=True)
        )
        agent = Agent(AnthropicModel(MODEL, client=client, stream=True))
        async with Session(agent) as session:

            def stop(event: Event) -> None:
                if isinstance(event, ModelStreamDelta):
                    session.cancel("stop")

            session.ctx.events.subscribe(stop)
            with pytest.raises(RunCancelled, match="model_stream"):
                await session.run("write an essay")
            assert session.conversation_messages == (UserMessage("write an essay"),)
        assert await server.wait_client_closed(), "the server never saw the connection close"

    async def test_cancel_while_waiting_for_the_response_closes_the_request(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(hang_up_on_client())
        agent = Agent(AnthropicModel(MODEL, client=client))
        async with Session(agent) as session:
            cancelled = await run_cancelled_once_sent(session, server, "hello?")
            assert session.conversation_messages == (UserMessage("hello?"),)
        assert (cancelled.checkpoint, cancelled.reason) == ("model_call", "timeout")
        assert await server.wait_client_closed()


PROMPT_TOO_LONG = anthropic_error_body(
    "prompt is too long: 208656 tokens > 200000 maximum", type="invalid_request_error"
)


class TestErrors:
    """Provider errors become tinyctx errors a budget guard or a Retry layer can act on."""

    async def test_prompt_too_long_is_context_limit_exceeded_with_the_numbers(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(error_reply(PROMPT_TOO_LONG, 400))
        with pytest.raises(ContextLimitExceeded) as caught:
            await AnthropicModel(MODEL, client=client)(ask(), ctx())
        assert caught.value.provider_message == "prompt is too long: 208656 tokens > 200000 maximum"
        assert (caught.value.estimate, caught.value.window) == (208656, 200000)

    async def test_input_plus_max_tokens_over_the_window_names_the_reserve(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        message = (
            "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again"
        )
        server.add(error_reply(anthropic_error_body(message, type="invalid_request_error"), 400))
        with pytest.raises(ContextLimitExceeded) as caught:
            await AnthropicModel(MODEL, client=client)(ask(), ctx())
        assert (caught.value.estimate, caught.value.reserved, caught.value.window) == (
            197000,
            8192,
            200000,
        )

    @pytest.mark.parametrize(
        ("reply", "error", "status", "retry_after"),
        [
            (
                error_reply(anthropic_error_body("Overloaded", type="overloaded_error"), 529),
                RetryableProviderError,
                529,
                None,
            ),
            (
                error_reply(
                    anthropic_error_body("slow down", type="rate_limit_error"),
                    429,
                    {"retry-after": "12"},
                ),
                RetryableProviderError,
                429,
                12.0,
            ),
            (
                error_reply(anthropic_error_body("oops", type="api_error"), 500),
                RetryableProviderError,
                500,
                None,
            ),
            (
                error_reply(anthropic_error_body("bad", type="invalid_request_error"), 400),
                ProviderError,
                400,
                None,
            ),
            (
                error_reply(anthropic_error_body("who?", type="authentication_error"), 401),
                ProviderError,
                401,
                None,
            ),
            (drop_connection(), RetryableProviderError, None, None),
        ],
        ids=["529-overloaded", "429-retry-after", "500", "400", "401", "connection"],
    )
    async def test_status_errors_map_to_retryable_or_final(
        self,
        server: LoopbackServer,
        client: anthropic.AsyncAnthropic,
        reply: Any,
        error: type[ProviderError],
        status: int | None,
        retry_after: float | None,
    ) -> None:
        server.add(reply)
        with pytest.raises(ProviderError) as caught:
            await AnthropicModel(MODEL, client=client)(ask(), ctx())
        assert type(caught.value) is error
        assert (caught.value.status, caught.value.provider) == (status, "anthropic")
        if error is RetryableProviderError:
            assert caught.value.retry_after == retry_after  # type: ignore[attr-defined]


PLACEHOLDER = "[Old tool result content cleared]"


class _ClearOldResults(Layer):
    """A budget-triggered compaction: past ``trigger`` characters of tool output, clear every
    result but the newest turn's. ``persist`` commits the rewrite to the conversation, as a
    persist=True layer does; otherwise it rewrites only this call's request."""

    def __init__(self, *, persist: bool, trigger: int) -> None:
        self.persist = persist
        self.trigger = trigger

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        messages = request.messages
        size = sum(len(m.content) for m in messages if isinstance(m, ToolResult))
        if size > self.trigger:
            turns = tool_turns(messages)
            keep = set(turns[-1].result_indices) if turns else set()
            messages = tuple(
                attrs.evolve(m, content=PLACEHOLDER)
                if isinstance(m, ToolResult) and i not in keep
                else m
                for i, m in enumerate(messages)
            )
            if self.persist:
                ctx.conversation.replace(messages, emit_new=False)
            request = request.evolve(messages=messages)
        return await call_next(request, ctx)


def _without_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def _marked(messages: list[dict[str, Any]]) -> list[int]:
    return [
        i
        for i, m in enumerate(messages)
        if any(isinstance(b, dict) and "cache_control" in b for b in m["content"])
    ]


class TestPromptCaching:
    """cache_prefix marks the stable prefix; persistent compaction keeps it byte-identical."""

    async def _run(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic, *, persist: bool
    ) -> list[dict[str, Any]]:
        for n in range(1, 5):
            server.add(
                json_reply(anthropic_message([tool_use(f"toolu_{n}", "read", {"path": f"f{n}"})]))
            )
        server.add(json_reply(anthropic_message([text("done")])))
        tool = FakeTool("read", returns="x" * 1000, parameters=SCHEMA)
        agent = Agent(
            AnthropicModel(MODEL, client=client),
            tools=[tool.tool],
            system_prompt="You read files.",
            middleware=[_ClearOldResults(persist=persist, trigger=2500)],
        )
        async with Session(agent) as session:
            await session.run("Read f1 to f4.")
        return [r.json() for r in server.requests]

    async def test_breakpoints_sit_on_tools_system_and_the_growing_prefix(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        bodies = await self._run(server, client, persist=True)
        for body in bodies:
            assert body["tools"][-1]["cache_control"] == EPHEMERAL
            assert body["system"][-1]["cache_control"] == EPHEMERAL
            messages = body["messages"]
            assert messages[-1]["content"][-1]["cache_control"] == EPHEMERAL
            marked = _marked(messages)
            assert len(marked) <= 2 and marked[-1] == len(messages) - 1
        # each call marks where the previous call put its last breakpoint: its cache is read
        for previous, current in zip(bodies, bodies[1:], strict=False):
            assert len(previous["messages"]) - 1 in _marked(current["messages"])

    async def test_persistent_compaction_keeps_the_cached_prefix_stable(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        bodies = await self._run(server, client, persist=True)
        # call 4 compacted (results 1-2 cleared, persisted); call 5 starts with call 4's prompt
        fourth, fifth = (_without_markers(b) for b in bodies[3:5])
        assert fourth["messages"][2]["content"][0]["content"] == PLACEHOLDER
        assert fifth["messages"][: len(fourth["messages"])] == fourth["messages"]
        assert (fifth["system"], fifth["tools"]) == (fourth["system"], fourth["tools"])

    async def test_a_transient_rewrite_breaks_the_prefix_the_previous_call_cached(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        bodies = await self._run(server, client, persist=False)
        fourth, fifth = (_without_markers(b) for b in bodies[3:5])
        prefix = fifth["messages"][: len(fourth["messages"])]
        assert prefix != fourth["messages"]
        changed = [
            i for i, (a, b) in enumerate(zip(prefix, fourth["messages"], strict=True)) if a != b
        ]
        assert changed == [6]  # result 3: full in call 4, cleared again by call 5's rewrite

    async def test_caching_can_be_turned_off_or_given_a_ttl(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(
            json_reply(anthropic_message([text("a")])), json_reply(anthropic_message([text("b")]))
        )
        request = ask(system_prompt="s", tools=(ToolSpec("read", "", SCHEMA),))
        await AnthropicModel(MODEL, client=client, cache_prefix=False)(request, ctx())
        await AnthropicModel(MODEL, client=client, cache_ttl="1h")(request, ctx())
        off, hour = (r.json() for r in server.requests)
        assert "cache_control" not in str(off)
        assert hour["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


class TestConfiguration:
    """Bad configuration fails at construction, naming the field and what is allowed."""

    async def test_bad_arguments_are_rejected(self, client: anthropic.AsyncAnthropic) -> None:
        with pytest.raises(ConfigError, match="AnthropicModel.max_tokens"):
            AnthropicModel(MODEL, client=client, max_tokens=0)
        with pytest.raises(ConfigError, match="AnthropicModel.cache_ttl"):
            AnthropicModel(MODEL, client=client, cache_ttl="1d")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"settings\['temprature'\]"):
            AnthropicModel(MODEL, client=client, temprature=1)
        with pytest.raises(ConfigError, match=r"settings\['system'\].*builds"):
            AnthropicModel(MODEL, client=client, system="x")
        with pytest.raises(ConfigError, match="AnthropicModel.client"):
            AnthropicModel(MODEL, client="nope")  # type: ignore[arg-type]

    async def test_a_mid_history_system_message_cannot_be_sent(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        history = (UserMessage("a"), SystemMessage("late rule"), UserMessage("b"))
        with pytest.raises(ValueError, match="message 1: cannot express a system message"):
            await AnthropicModel(MODEL, client=client)(ModelRequest(history), ctx())
        assert server.requests == []

    async def test_user_messages_between_a_call_and_its_result_go_after_the_results(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        server.add(json_reply(anthropic_message([text("ok")])))
        history = (
            UserMessage("go"),
            AssistantMessage("", (ToolCall("toolu_1", "read", {"path": "a"}),)),
            UserMessage("(the user typed while the tool ran)"),
            ToolResult("toolu_1", "A", "read"),
        )
        await AnthropicModel(MODEL, client=client, cache_prefix=False)(ModelRequest(history), ctx())
        assert server.requests[0].json()["messages"][2] == {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
                text("(the user typed while the tool ran)"),
            ],
        }
