"""One nesting limit for everything a thread keeps (tinyctx.codec.MAX_NESTING): a value nested
deeper is refused where it enters, naming the field, and is never stored; a stored document
nested deeper is a CodecError when read, with or without the C reader, never RecursionError."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_message,
    json_reply,
    openai_client,
    openai_completion,
)
from tinyctx import (
    Agent,
    AssistantMessage,
    Interrupt,
    RunConfig,
    Session,
    Suspend,
    ToolCall,
    ToolResult,
    UserMessage,
    codec,
)
from tinyctx.codec import (
    MAX_NESTING,
    CodecError,
    decode_checkpoint,
    decode_messages,
    decode_state,
    encode_message,
    encode_state,
)
from tinyctx.formats._common import parse_arguments
from tinyctx.frozen import FrozenDict, NestingError
from tinyctx.providers import AnthropicModel, OpenAIChatModel
from tinyctx.state import StateError, check_json
from tinyctx.stores import SqliteStore
from tinyctx.testing import FakeTool, ScriptedModel, reply
from tinyctx.threads import ThreadWrite

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

# the depths the issue saw brick a thread (350-490), start the run's RecursionError (500+),
# and far past any stack
TOO_DEEP = [MAX_NESTING + 1, 350, 490, 500, 5000]


def nested(levels: int, leaf: Any = "leaf") -> Any:
    """``leaf`` inside ``levels`` objects: ``nested(2) == {"k": {"k": "leaf"}}``."""
    value = leaf
    for _ in range(levels):
        value = {"k": value}
    return value


def wrapped(levels: int) -> FrozenDict[str, Any]:
    """A mapping nested ``levels`` deep that no constructor walked (FrozenDict keeps what it
    is given): what reaches the encoder when a caller builds one by hand."""
    value: Any = "leaf"
    for _ in range(levels):
        value = FrozenDict({"k": value})
    return value  # type: ignore[no-any-return]


def nested_text(levels: int) -> str:
    """The JSON text of ``nested(levels)``, written out (the encoder refuses to)."""
    return '{"k":' * levels + '"leaf"' + "}" * levels


def user_doc(metadata: str) -> str:
    """A user message's document with ``metadata`` (JSON text) as its metadata."""
    return '{"content":"hi","metadata":' + metadata + ',"role":"user","v":1}'


@pytest.fixture(params=["c", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Decode with the C reader where it is built, and with the Python reader alone."""
    if request.param == "python":
        monkeypatch.setattr(codec, "_read_rows", None)
    elif not codec.C_READER:
        pytest.skip("tinyctx._speedups is not built here")
    return str(request.param)


class TestWhereValuesEnter:
    """Constructors, control values, layer state and the encoder refuse nesting past the
    limit with an error naming the field."""

    def test_the_limit_itself_round_trips(self) -> None:
        """Metadata and arguments nested exactly MAX_NESTING levels are kept and read back."""
        message = AssistantMessage(
            "", (ToolCall("c1", "run", nested(MAX_NESTING)),), metadata=nested(MAX_NESTING)
        )
        assert decode_messages([encode_message(message)]) == (message,)

    @pytest.mark.parametrize("levels", TOO_DEEP)
    def test_message_and_call_constructors_refuse(self, levels: int) -> None:
        """A message's metadata or a call's arguments past the limit: NestingError there."""
        with pytest.raises(NestingError, match=r"Message\.metadata: nested deeper than 100"):
            UserMessage("hi", metadata=nested(levels))
        with pytest.raises(NestingError, match=r"ToolCall\.arguments: nested deeper than 100"):
            ToolCall("c1", "run", nested(levels))
        with pytest.raises(TypeError, match="argument 'k' is not JSON: it nests deeper"):
            ToolCall("c1", "run", wrapped(levels))

    @pytest.mark.parametrize("levels", TOO_DEEP)
    def test_control_payloads_and_run_configs_refuse(self, levels: int) -> None:
        """An interrupt's payload, a suspension's state and run-config metadata too."""
        with pytest.raises(NestingError, match=r"Interrupt\.payload: nested"):
            Interrupt("review", payload=nested(levels))
        with pytest.raises(NestingError, match=r"Suspend\.state: nested"):
            Suspend("review", state=nested(levels))
        with pytest.raises(ValueError, match="nested deeper"):
            RunConfig(run_id="r", thread_id="t", root_run_id="r", metadata=nested(levels))

    def test_a_suspensions_state_counts_where_the_checkpoint_keeps_it(self) -> None:
        """Suspend.state sits two objects down the checkpoint's state: 98 levels are its most."""
        Suspend("review", state=nested(MAX_NESTING - 2))
        with pytest.raises(NestingError):
            Suspend("review", state=nested(MAX_NESTING - 1))

    @pytest.mark.parametrize("levels", TOO_DEEP)
    def test_layer_state_is_refused_naming_the_layer(self, levels: int) -> None:
        """A layer state past the limit (the mapping of layers counted): StateError, CodecError."""
        check_json(nested(MAX_NESTING - 1), "layer")
        with pytest.raises(StateError, match="^layer.k.*nested deeper than 100"):
            check_json(nested(levels), "layer")
        with pytest.raises(CodecError, match="nested deeper than 100") as raised:
            encode_state({"layer": wrapped(levels)})
        assert raised.value.path.startswith("state.layer.k")

    @pytest.mark.parametrize("levels", TOO_DEEP)
    def test_the_encoder_refuses_naming_the_path(self, levels: int) -> None:
        """What slipped past the constructors is a CodecError at encoding, path shortened."""
        with pytest.raises(CodecError, match="nested deeper than 100") as raised:
            encode_message(UserMessage("hi", metadata=wrapped(levels)))
        path = raised.value.path
        assert path.startswith("metadata.k.k")
        assert len(path) < 120


class TestStoredDocuments:
    """A document nested past the limit is a CodecError naming the field, on either reader."""

    @pytest.mark.parametrize("levels", [*TOO_DEEP, 100_000])
    @pytest.mark.parametrize("where", ["metadata", "arguments"])
    def test_messages(self, reader: str, where: str, levels: int) -> None:
        """Message metadata or call arguments stored that deep: CodecError, never Recursion."""
        if where == "metadata":
            doc = user_doc(nested_text(levels))
        else:
            doc = (
                '{"role":"assistant","tool_calls":[{"arguments":'
                + nested_text(levels)
                + ',"id":"c1","name":"run"}],"v":1}'
            )
        with pytest.raises(CodecError, match="nested") as raised:
            decode_messages([encode_message(UserMessage("first")), doc])
        assert raised.value.path.startswith("messages[1]")

    @pytest.mark.parametrize("levels", TOO_DEEP)
    def test_checkpoint_payload_and_layer_state(self, levels: int) -> None:
        """An interrupt payload or layer state stored that deep: CodecError naming it."""
        with pytest.raises(CodecError, match="nested") as raised:
            decode_state('{"state":{"layer":' + nested_text(levels) + '},"v":1}')
        assert raised.value.path in ("state", "")
        doc = (
            '{"added":[],"message":"","messages":[],"model_calls":0,"node":"n","payload":'
            + nested_text(levels)
            + ',"pending":[],"phase":"before_model","run_config":{"root_run_id":"r",'
            '"run_id":"r","thread_id":"t"},"tool_calls":0,"v":1}'
        )
        with pytest.raises(CodecError, match="nested") as raised:
            decode_checkpoint(doc)
        assert raised.value.path in ("payload", "")

    async def test_a_session_on_such_a_thread_raises_codec_error(
        self, reader: str, tmp_path: Path
    ) -> None:
        """Opening a thread whose stored row nests 400 deep is a CodecError, not Recursion."""
        doc = user_doc(nested_text(400))
        async with SqliteStore(tmp_path / "t.db") as store:
            await store.write("t", ThreadWrite(append=(doc,)), expected_version=0)
            agent = Agent(ScriptedModel([reply("ok")]))
            with pytest.raises(CodecError, match="nested"):
                async with Session(agent, thread_id="t", store=store):
                    pass


class TestRunsRefuseAtTheBoundary:
    """A run refuses input nested past the limit before anything is stored."""

    @pytest.mark.parametrize("levels", TOO_DEEP)
    async def test_input_is_a_codec_error_naming_input_0(self, levels: int, tmp_path: Path) -> None:
        """run() raises CodecError naming input[0].metadata; the thread stays as it was."""
        async with SqliteStore(tmp_path / "t.db") as store:
            agent = Agent(ScriptedModel([reply("fine")]))
            async with Session(agent, thread_id="t", store=store) as session:
                with pytest.raises(CodecError, match="nested deeper than 100") as raised:
                    await session.run(UserMessage("hi", metadata=wrapped(levels)))
                assert raised.value.path.startswith("input[0].metadata.k")
                assert (await session.run("still here")).final_text == "fine"
            record = await store.load_thread("t")
            assert len(record.messages) == 2
            async with Session(agent, thread_id="t", store=store) as reopened:
                assert reopened.conversation_messages[0] == UserMessage("still here")


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(server) as sdk_client:
        yield sdk_client


class TestModelArguments:
    """Tool-call arguments a model nests past the limit are invalid arguments: that call gets
    an error result and the run goes on."""

    @pytest.mark.parametrize(
        "arguments",
        [
            '{"q":' + nested_text(MAX_NESTING) + "}",
            '{"q":' + nested_text(330) + "}",
            '{"q":' + nested_text(5000) + "}",
            '{"q": NaN}',
            '{"q": [1e400]}',
            '{"q": ' + "7" * 4301 + "}",
        ],
        ids=["101-levels", "330-levels", "5000-levels", "nan", "overflow", "4301-digits"],
    )
    async def test_through_the_openai_adapter(
        self, arguments: str, server: LoopbackServer, client: openai.AsyncOpenAI, tmp_path: Path
    ) -> None:
        """That call is answered with an error, the next one runs, the thread reopens."""
        server.add(
            json_reply(
                openai_completion(None, [("c1", "lookup", arguments), ("c2", "lookup", "{}")])
            )
        )
        server.add(json_reply(openai_completion("done")))
        lookup = FakeTool("lookup", returns="found")
        agent = Agent(OpenAIChatModel("gpt-4o", client=client), tools=[lookup.tool])
        async with SqliteStore(tmp_path / "t.db") as store:
            async with Session(agent, thread_id="t", store=store) as session:
                result = await session.run("look it up")
            assert result.final_text == "done"
            assert lookup.calls == [{}]
            first = next(m for m in result.messages if isinstance(m, ToolResult))
            assert first.tool_call_id == "c1" and first.is_error
            assert "not a JSON object (nested at most 100 levels)" in first.text
            async with Session(agent, thread_id="t", store=store) as reopened:
                assert reopened.conversation_messages == result.messages

    @pytest.mark.parametrize("levels", [MAX_NESTING + 1, 330])
    async def test_through_the_anthropic_adapter(self, levels: int, server: LoopbackServer) -> None:
        """tool_use input nested past the limit (an object the SDK parsed): an error result."""
        deep = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": nested(levels)}
        fine = {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {}}
        server.add(
            json_reply(anthropic_message([deep, fine])),
            json_reply(anthropic_message([{"type": "text", "text": "done"}])),
        )
        lookup = FakeTool("lookup", returns="found")
        async with anthropic_client(server) as sdk:
            model = AnthropicModel("claude-sonnet-4-6", client=sdk, cache_prefix=False)
            async with Session(Agent(model, tools=[lookup.tool])) as session:
                result = await session.run("look it up")
        assert result.final_text == "done"
        assert lookup.calls == [{}]
        first = next(m for m in result.messages if isinstance(m, ToolResult))
        assert first.tool_call_id == "toolu_1" and first.is_error

    def test_an_object_given_whole_is_invalid_past_the_limit(self) -> None:
        """Arguments an SDK parsed already (Anthropic's input) past the limit are invalid."""
        assert parse_arguments(nested(MAX_NESTING)) == (nested(MAX_NESTING), None)
        arguments, invalid = parse_arguments(nested(MAX_NESTING + 1))
        assert arguments == {} and invalid == nested_text(MAX_NESTING + 1).replace(":", ": ")
        arguments, invalid = parse_arguments(nested(5000))
        assert arguments == {} and invalid == "<a dict nested deeper than 100 levels>"
