"""tinyctx.testing: every public helper does what a layer author relies on."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
import structlog
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    EventSink,
    Interrupt,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    StopWithFinal,
    SystemMessage,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.events import ModelStreamDelta, RunStarted
from tinyctx.frozen import thaw
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.testing import (
    HANG,
    MODEL_CALL_CHECKPOINT,
    STREAM_CHECKPOINT,
    TOOL_CALL_CHECKPOINT,
    EchoModel,
    FakeTool,
    ScriptedModel,
    ScriptExhausted,
    assemble_stream,
    assert_events_form_tree,
    assert_idempotent,
    assert_pairing_intact,
    assert_parent_unchanged,
    assert_within_budget,
    call,
    capture_events,
    quiet_context,
    reply,
    run_layer,
    run_tool_layer,
    stream,
)
from tinyctx.testing.strategies import (
    contexts,
    controls,
    histories,
    messages,
    requests,
    responses,
    run_configs,
    tool_calls,
    tool_results,
    tool_specs,
    usages,
)
from tinyctx.tokens import HeuristicCounter
from tinyctx.tools import ToolSpec

# ---------------------------------------------------------------------------------------
# helpers


def drop_first_result(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The bug every compaction layer must not have: half of a call/result unit dropped."""
    index = next((i for i, m in enumerate(messages) if isinstance(m, ToolResult)), None)
    if index is None:
        return messages
    return messages[:index] + messages[index + 1 :]


class DropsOneToolResult(Layer):
    """A deliberately broken layer: it sends the model a request without one tool result."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request.evolve(messages=drop_first_result(request.messages)), ctx)


def layer_breaks_pairing(history: tuple[Message, ...]) -> bool:
    """Run the broken layer on a request of ``history``; True when the invariant catches it."""
    request = ModelRequest(messages=history)
    model = EchoModel()

    async def drive() -> None:
        await run_layer(DropsOneToolResult(), request, next=model)

    anyio.run(drive, backend="trio")
    try:
        assert_pairing_intact(model.requests[0].messages, history, allow_pending=False)
    except AssertionError:
        return True
    return False


def last_message_pairs(history: tuple[Message, ...], message: Message) -> None:
    """A generated message appended to a valid history keeps pairing (calls may wait)."""
    if isinstance(message, ToolResult):
        opener = AssistantMessage("", (ToolCall(message.tool_call_id, message.name or "t"),))
        check_pairing((*history, opener, message), allow_pending=False)
    else:
        check_pairing((*history, message), allow_pending=True)


# ---------------------------------------------------------------------------------------
# strategies


@pytest.mark.slow  # thousands of examples per strategy
class TestStrategiesKeepPairing:
    """Every strategy that yields messages yields valid pairing, over thousands of examples."""

    @settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
    @given(history=histories())
    def test_histories_pair_over_2000_examples(self, history: tuple[Message, ...]) -> None:
        check_pairing(history, allow_pending=False)
        assert pending_tool_calls(history) == ()

    @settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
    @given(
        value=st.one_of(
            histories(max_turns=6, pending=True, max_results_per_turn=5).map(
                lambda h: ("pending", h)
            ),
            requests(history=histories(max_turns=6)).map(lambda r: ("request", r.messages)),
            st.from_type(ModelRequest).map(lambda r: ("request", r.messages)),
            contexts(history=histories(max_turns=6)).map(
                lambda c: ("request", c.conversation.messages)
            ),
            st.tuples(histories(max_turns=4), responses()).map(
                lambda hr: ("pending", (*hr[0], hr[1].message))
            ),
            st.tuples(histories(max_turns=4), messages()).map(lambda hm: ("message", hm)),
        )
    )
    def test_every_other_strategy_pairs_over_2000_examples(self, value: Any) -> None:
        kind, payload = value
        if kind == "message":
            last_message_pairs(*payload)
        else:
            check_pairing(payload, allow_pending=kind == "pending")


class TestShrinking:
    """A failing example shrinks to the few messages that show the bug."""

    def test_a_layer_dropping_a_tool_result_is_caught_and_shrunk_to_4_messages(self) -> None:
        minimal = find(
            histories(), layer_breaks_pairing, settings=settings(database=None, deadline=None)
        )
        assert len(minimal) <= 4
        assert [m.role for m in minimal][:2] == ["assistant", "tool"]
        assert all(m.text == "" for m in minimal)


class TestHistories:
    """histories() honours every parameter and rejects bad ones at once."""

    @given(history=histories(min_turns=2, max_turns=3, with_system=False, max_results_per_turn=2))
    def test_turn_bounds_and_results_per_turn(self, history: tuple[Message, ...]) -> None:
        assistants = [m for m in history if isinstance(m, AssistantMessage)]
        users = [m for m in history if isinstance(m, UserMessage)]
        assert 2 <= len(assistants) + len(users) <= 3
        assert not any(isinstance(m, SystemMessage) for m in history)
        assert all(len(m.tool_calls) <= 2 for m in assistants)

    @given(history=histories(tool_turn_probability=0, nonessential=False))
    def test_no_tool_turns_and_every_message_essential(self, history: tuple[Message, ...]) -> None:
        assert not any(isinstance(m, ToolResult) for m in history)
        assert all(m.essential for m in history)

    @given(history=histories(min_turns=1, tool_turn_probability=1, with_system=False))
    def test_every_turn_a_tool_turn(self, history: tuple[Message, ...]) -> None:
        assistants = [m for m in history if isinstance(m, AssistantMessage)]
        assert assistants
        assert all(m.tool_calls for m in assistants)
        assert not any(isinstance(m, UserMessage) for m in history)

    @given(history=histories(text=st.just("fixed"), with_system=False))
    def test_text_strategy_draws_every_body(self, history: tuple[Message, ...]) -> None:
        assert all(m.text == "fixed" for m in history)

    def test_generates_the_shapes_layers_must_handle(self) -> None:
        # find() stops at the first match; the profile's max_examples (50 under "dev") can
        # miss a rarer shape by chance, so give it room
        quick = settings(database=None, deadline=None, max_examples=2_000)
        nonessential = find(histories(), lambda h: any(not m.essential for m in h), settings=quick)
        assert [m.essential for m in nonessential] == [False]
        errors = find(
            histories(),
            lambda h: any(isinstance(m, ToolResult) and m.is_error for m in h),
            settings=quick,
        )
        assert [m.role for m in errors] == ["assistant", "tool"]
        reordered = find(
            histories(),
            lambda h: any(
                isinstance(a, ToolResult)
                and isinstance(b, ToolResult)
                and a.tool_call_id > b.tool_call_id
                for a, b in zip(h, h[1:], strict=False)
            ),
            settings=quick,
        )
        assert len(reordered) >= 3
        pending = find(
            histories(pending=True), lambda h: bool(pending_tool_calls(h)), settings=quick
        )
        assert isinstance(pending[0], AssistantMessage) and pending[0].tool_calls

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"min_turns": -1}, "min_turns"),
            ({"min_turns": 3, "max_turns": 2}, "max_turns"),
            ({"tool_turn_probability": 1.5}, "tool_turn_probability"),
            ({"max_results_per_turn": 0}, "max_results_per_turn"),
        ],
    )
    def test_bad_parameters_name_the_field(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            histories(**kwargs)
        assert info.value.field == field
        assert info.value.owner == "histories"


class TestOtherStrategies:
    """Each strategy builds valid values and composes with the others."""

    @given(request=requests(history=histories(max_turns=2), tools=st.just([])))
    def test_requests_compose_with_a_history_and_tools(self, request: ModelRequest) -> None:
        assert request.tools == ()
        assert len([m for m in request.messages if not isinstance(m, ToolResult)]) <= 3

    @given(ctx=contexts(data=st.integers(), history=histories(max_turns=3), nested=True))
    def test_contexts_carry_data_history_and_lineage(self, ctx: RunContext[Any]) -> None:
        assert isinstance(ctx.data, int)
        check_pairing(ctx.conversation.messages, allow_pending=False)
        config = ctx.config
        assert len(config.lineage) == config.depth
        if config.depth:
            assert config.lineage[0] == config.root_run_id
            assert config.lineage[-1] == config.parent_run_id
        child = ctx.derive()  # there is always room for one more level
        assert child.config.lineage == (*config.lineage, config.run_id)

    @given(config=run_configs())
    def test_run_configs_are_roots_with_a_consistent_window(self, config: RunConfig) -> None:
        assert config.depth == 0 and config.root_run_id == config.run_id
        if config.max_tokens is not None:
            assert 0 <= config.reserved_output_tokens < config.max_tokens

    @given(response=responses(control=True), usage=usages(), control=controls())
    def test_responses_usage_and_controls(
        self, response: ModelResponse, usage: Usage, control: StopWithFinal | Interrupt
    ) -> None:
        ids = [c.id for c in response.message.tool_calls]
        assert len(ids) == len(set(ids))
        assert usage.cached_tokens <= usage.input_tokens
        assert isinstance(control, (StopWithFinal, Interrupt))

    @given(message=messages(roles=("user", "tool"), metadata=False))
    def test_messages_honour_roles(self, message: Message) -> None:
        assert message.role in ("user", "tool")
        assert not message.metadata

    @given(call=tool_calls(), spec=tool_specs(), data=st.data())
    def test_tool_calls_results_and_specs(
        self, call: ToolCall, spec: ToolSpec, data: st.DataObject
    ) -> None:
        result = data.draw(tool_results(call))
        assert (result.tool_call_id, result.name) == (call.id, call.name)
        assert json.loads(json.dumps(thaw(spec.parameters)))["type"] == "object"

    def test_bad_roles_name_the_field(self) -> None:
        with pytest.raises(ConfigError, match="roles"):
            messages(roles=("narrator",))  # type: ignore[arg-type]


class TestFromType:
    """st.from_type builds valid tinyctx values, registered as soon as hypothesis is imported."""

    @settings(max_examples=50)  # nine strategies per example: each sees 50 values
    @given(
        result=st.from_type(ToolResult),
        message=st.from_type(Message),
        request=st.from_type(ModelRequest),
        response=st.from_type(ModelResponse),
        config=st.from_type(RunConfig),
        usage=st.from_type(Usage),
        stop=st.from_type(StopWithFinal),
        ctx=st.from_type(RunContext[int]),
        conversation=st.from_type(Conversation),
    )
    def test_registered_types_build_valid_values(
        self,
        result: ToolResult,
        message: Message,
        request: ModelRequest,
        response: ModelResponse,
        config: RunConfig,
        usage: Usage,
        stop: StopWithFinal,
        ctx: RunContext[Any],
        conversation: Conversation,
    ) -> None:
        assert result.tool_call_id
        assert isinstance(message, Message)
        check_pairing(request.messages, allow_pending=False)
        assert isinstance(response.message, AssistantMessage)
        assert config.root_run_id == config.run_id
        assert usage.cached_tokens <= usage.input_tokens
        assert isinstance(stop, StopWithFinal)
        assert isinstance(ctx, RunContext)
        check_pairing(conversation.messages, allow_pending=False)

    @pytest.mark.parametrize("first", ["hypothesis", "tinyctx"])
    def test_registration_needs_no_import_of_the_strategies(self, first: str) -> None:
        """Registered whichever of hypothesis and tinyctx is imported first."""
        imports = {
            "hypothesis": "import hypothesis.strategies as st\n"
            # the hook imports nothing of tinyctx while tinyctx is not imported
            "assert not [m for m in sys.modules if m.split('.')[0] == 'tinyctx'], sorted(\n"
            "    m for m in sys.modules if m.startswith('tinyctx'))\n"
            "from tinyctx import ToolResult, ToolCall\n",
            "tinyctx": "from tinyctx import ToolResult, ToolCall\n"
            "assert 'tinyctx.testing.strategies' not in sys.modules\n"
            "import hypothesis.strategies as st\n",
        }
        code = (
            "import sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            + imports[first]
            + "assert 'tinyctx.testing.strategies' in sys.modules\n"
            "value = st.from_type(ToolResult).example()\n"
            "assert isinstance(value, ToolResult) and value.tool_call_id\n"
            "assert isinstance(st.from_type(ToolCall).example(), ToolCall)\n"
            "print('ok')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------
# fakes


class TestReplyAndCall:
    """reply() and call() build responses and calls with fresh ids."""

    def test_reply_with_calls_usage_and_control(self) -> None:
        first, second = call("search", q="x"), call("read", id="fixed")
        assert first.id != call("search").id
        assert second.id == "fixed"
        response = reply("text", first, usage=(3, 4), control=StopWithFinal("s"), model="m")
        assert response.message.tool_calls == (first,)
        assert response.usage == Usage(3, 4)
        assert (response.control, response.model) == (StopWithFinal("s"), "m")


class TestScriptedModel:
    """ScriptedModel plays any kind of script item and records what it received."""

    async def test_plays_every_kind_of_item_and_records_requests(self) -> None:
        async def later(request: ModelRequest, ctx: RunContext[Any]) -> str:
            return f"saw {len(request.messages)}"

        model = ScriptedModel(
            [
                "plain",
                AssistantMessage("message"),
                reply("response", usage=(1, 2)),
                lambda request, ctx: reply("sync function"),
                later,
                lambda request, ctx: lambda r, c: "function returning a function",
            ],
            name="m",
        )
        ctx = quiet_context()
        request = ModelRequest(messages=(UserMessage("hi"),), model="gpt-4o")
        texts = [(await model(request, ctx)).text for _ in range(6)]
        assert texts == [
            "plain",
            "message",
            "response",
            "sync function",
            "saw 1",
            "function returning a function",
        ]
        assert model.calls == 6 and model.remaining == 0
        assert model.requests[0] is request and model.contexts[0] is ctx
        assert (await ScriptedModel(["x"])(request, ctx)).model == "gpt-4o"

    async def test_exhausted_script_says_so(self) -> None:
        model = ScriptedModel(["only"], name="m")
        ctx = quiet_context()
        request = ModelRequest(messages=(UserMessage("hi"),))
        await model(request, ctx)
        with pytest.raises(ScriptExhausted, match="'m': script of 1 items exhausted at call 2"):
            await model(request, ctx)

    async def test_repeat_last_and_add(self) -> None:
        model = ScriptedModel(repeat_last=True).add("a", "b")
        ctx = quiet_context()
        request = ModelRequest(messages=())
        assert [(await model(request, ctx)).text for _ in range(3)] == ["a", "b", "b"]

    async def test_exceptions_are_raised_and_bad_items_named(self) -> None:
        ctx = quiet_context()
        request = ModelRequest(messages=())
        with pytest.raises(ConnectionError, match="down"):
            await ScriptedModel([ConnectionError("down")])(request, ctx)
        with pytest.raises(TypeError, match="got int"):
            await ScriptedModel([lambda r, c: 42])(request, ctx)

    async def test_hang_ends_with_run_cancelled_when_the_token_is_cancelled(self) -> None:
        ctx = quiet_context()
        model = ScriptedModel([HANG])

        async def cancel_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            ctx.cancellation.cancel("stop waiting")

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            with pytest.raises(RunCancelled) as info:
                await model(ModelRequest(messages=()), ctx)
        assert (info.value.checkpoint, info.value.reason) == (MODEL_CALL_CHECKPOINT, "stop waiting")

    async def test_hang_in_a_session_is_cancelled_by_the_session(self) -> None:
        model = ScriptedModel([HANG])
        async with Session(Agent(model=model), events=EventSink(logger=None)) as session:

            async def run() -> None:
                with pytest.raises(RunCancelled):
                    await session.run("go")

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.wait_all_tasks_blocked()
                session.cancel("bye")
        assert [m.role for m in session.conversation_messages] == ["user"]


class TestStreaming:
    """stream() delivers a response chunk by chunk, each raced against cancellation."""

    def test_parts_become_deltas_that_assemble_to_the_response(self) -> None:
        search = ToolCall("c1", "search", {"q": "日本語", "n": 3})
        item = stream("It is ", "an onion.", search, usage=(5, 6), chunk_size=4)
        deltas = item.deltas
        assert [d.text for d in deltas[:2]] == ["It is ", "an onion."]
        head = deltas[2]
        assert (head.tool_call_index, head.tool_call_id, head.tool_name) == (0, "c1", "search")
        fragments = [d.arguments_delta for d in deltas[3:]]
        assert all(0 < len(f) <= 4 for f in fragments)
        assert json.loads("".join(fragments)) == {"q": "日本語", "n": 3}
        assert item.message == AssistantMessage("It is an onion.", (search,))
        assert item.usage == Usage(5, 6)

    def test_a_response_part_streams_its_text_calls_usage_and_control(self) -> None:
        response = reply(
            "abcdefghij",
            ToolCall("a", "x"),
            ToolCall("b", "y", {"k": 1}),
            usage=(1, 1),
            control=Interrupt("n"),
            model="m",
        )
        item = stream(response, chunk_size=3)
        assert [d.text for d in item.deltas if d.text] == ["abc", "def", "ghi", "j"]
        assert [d.tool_call_index for d in item.deltas if d.tool_call_id] == [0, 1]
        assert item.message == response.message
        assert (item.usage, item.control, item.model) == (Usage(1, 1), Interrupt("n"), "m")

    def test_invalid_arguments_are_reported_as_a_provider_would(self) -> None:
        broken = ToolCall("c", "run", invalid_arguments='{"cmd": "ls"')
        assert stream(broken).message.tool_calls[0].invalid_arguments == '{"cmd": "ls"'
        raw = stream(
            ModelStreamDelta(tool_call_index=3, tool_call_id="r", tool_name="t"),
            ModelStreamDelta(tool_call_index=3, arguments_delta="[1, 2]"),
        )
        assert raw.message.tool_calls == (ToolCall("r", "t", invalid_arguments="[1, 2]"),)

    def test_bad_streams_are_rejected_clearly(self) -> None:
        with pytest.raises(TypeError, match="stream parts"):
            stream(42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="chunk_size"):
            stream("x", chunk_size=0)
        with pytest.raises(ValueError, match="no index"):
            assemble_stream([ModelStreamDelta(tool_call_id="x")])
        with pytest.raises(ValueError, match="never received an id and a name"):
            assemble_stream([ModelStreamDelta(tool_call_index=0, arguments_delta="{}")])
        with pytest.raises(ValueError, match="changes its id"):
            assemble_stream(
                [
                    ModelStreamDelta(tool_call_index=0, tool_call_id="a", tool_name="t"),
                    ModelStreamDelta(tool_call_index=0, tool_call_id="b"),
                ]
            )

    async def test_a_streamed_tool_turn_runs_through_a_session(self) -> None:
        lookup = FakeTool("lookup", returns="found")
        model = ScriptedModel(
            [
                stream(reply("", call("lookup", id="s1", q="x"), usage=(10, 2))),
                stream("All ", "done.", usage=(20, 3)),
            ]
        )
        agent = Agent(model=model, tools=[lookup.tool])
        with capture_events(ModelStreamDelta) as deltas:
            async with Session(agent, events=EventSink(logger=None)) as session:
                result = await session.run("go")
        assert result.final_text == "All done."
        assert result.usage == Usage(30, 5)
        assert lookup.calls == [{"q": "x"}]
        assert assemble_stream(deltas[-2:]).content == "All done."
        assert_events_form_tree(deltas)
        check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_cancel_between_chunks_keeps_nothing_of_the_stream(self) -> None:
        model = ScriptedModel([stream("one ", "two ", "three", usage=(9, 9))])
        seen: list[str] = []
        async with Session(Agent(model=model), events=EventSink(logger=None)) as session:

            def cancel_on_second(event: Any) -> None:
                if isinstance(event, ModelStreamDelta):
                    seen.append(event.text)
                    if len(seen) == 2:
                        model.contexts[0].cancellation.cancel("enough")

            session.ctx.events.subscribe(cancel_on_second)
            with pytest.raises(RunCancelled) as info:
                await session.run("go")
            assert info.value.checkpoint == STREAM_CHECKPOINT
            assert seen == ["one ", "two "]
            assert [m.role for m in session.conversation_messages] == ["user"]
            assert session.ctx.usage.total() == Usage()
            # the run's own token was cancelled, so the session goes on
            model.add("fresh")
            assert (await session.run("again")).final_text == "fresh"

    async def test_a_cancel_after_the_last_chunk_still_drops_the_answer(self) -> None:
        model = ScriptedModel([stream("only")])
        ctx = quiet_context()
        ctx.events.subscribe(lambda event: ctx.cancellation.cancel("late"))
        with pytest.raises(RunCancelled):
            await model(ModelRequest(messages=()), ctx)

    async def test_a_hung_stream_waits_for_cancellation(self) -> None:
        ctx = quiet_context()
        model = ScriptedModel([stream("partial", HANG, "never")])
        with capture_events(ModelStreamDelta) as deltas:
            async with anyio.create_task_group() as tg:

                async def cancel_when_hung() -> None:
                    await anyio.wait_all_tasks_blocked()
                    ctx.cancellation.cancel()

                tg.start_soon(cancel_when_hung)
                with pytest.raises(RunCancelled):
                    await model(ModelRequest(messages=()), ctx)
        assert [d.text for d in deltas] == ["partial"]

    async def test_a_broken_stream_raises_after_the_chunks_before_it(self) -> None:
        model = ScriptedModel([stream("par", ConnectionResetError("reset"), "never")])
        with capture_events(ModelStreamDelta) as deltas:
            with pytest.raises(ConnectionResetError):
                await model(ModelRequest(messages=()), quiet_context())
        assert [d.text for d in deltas] == ["par"]


class TestEchoModel:
    """EchoModel answers with the last user text and records requests."""

    async def test_echoes_with_prefix_and_usage(self) -> None:
        model = EchoModel(prefix="> ", usage=Usage(1, 1))
        request = ModelRequest(messages=(UserMessage("a"), AssistantMessage("b")), model="m")
        response = await model(request, quiet_context())
        assert (response.text, response.usage, response.model) == ("> a", Usage(1, 1), "m")
        assert model.calls == 1 and model.requests == [request]
        assert (await model(ModelRequest(messages=()), quiet_context())).text == "> "


class TestFakeTool:
    """FakeTool returns values, sequences, errors, hangs and function results."""

    async def invoke(self, tool: FakeTool, ctx: RunContext[Any] | None = None, **args: Any) -> Any:
        return await tool.tool.invoke(args, ctx or quiet_context())

    async def test_values_json_and_tool_results(self) -> None:
        assert await self.invoke(FakeTool("t")) == "ok"
        assert json.loads(await self.invoke(FakeTool("t", returns={"a": [1]}))) == {"a": [1]}
        assert json.loads(await self.invoke(FakeTool("t", returns=(1, 2)))) == [1, 2]
        result = ToolResult("x", "given")
        assert await self.invoke(FakeTool("t", returns=result)) is result

    async def test_a_list_is_a_sequence_then_exhausted(self) -> None:
        tool = FakeTool("t", returns=["first", ValueError("second fails"), {"n": 3}])
        assert await self.invoke(tool) == "first"
        with pytest.raises(ValueError, match="second fails"):
            await self.invoke(tool)
        assert json.loads(await self.invoke(tool)) == {"n": 3}
        with pytest.raises(ScriptExhausted, match="3 scripted results, called 4 times"):
            await self.invoke(tool)

    async def test_functions_of_arguments_and_context_sync_or_async(self) -> None:
        ctx = quiet_context()

        async def with_ctx(arguments: Any, context: RunContext[Any]) -> str:
            return f"{arguments['q']} in {context.thread_id == ctx.thread_id}"

        assert await self.invoke(FakeTool("t", returns=lambda a: a["q"] * 2), q="ab") == "abab"
        assert await self.invoke(FakeTool("t", returns=with_ctx), ctx, q="x") == "x in True"

    async def test_records_calls_contexts_and_requests_control(self) -> None:
        tool = FakeTool("t", control=Interrupt("review"), description="d")
        ctx = quiet_context()
        await self.invoke(tool, ctx, q="1")
        assert tool.calls == [{"q": "1"}] and tool.contexts == [ctx]
        assert ctx.control.peek() == Interrupt("review")
        assert tool.tool.description == "d" and tool.name == "t"

    async def test_errors_become_error_results_in_a_run(self) -> None:
        model = ScriptedModel([reply("", call("t", id="c1")), "done"])
        tool = FakeTool("t", returns=KeyError("gone"))
        async with Session(Agent(model=model, tools=[tool.tool])) as session:
            await session.run("go")
        result = session.conversation_messages[2]
        assert isinstance(result, ToolResult) and result.is_error
        assert "KeyError" in result.content

    async def test_hang_ends_when_the_run_is_cancelled_and_pairing_holds(self) -> None:
        model = ScriptedModel([reply("", call("t", id="h1"), call("t", id="h2"))])
        tool = FakeTool("t", returns=HANG)
        async with Session(Agent(model=model, tools=[tool.tool])) as session:

            async def run() -> None:
                with pytest.raises(RunCancelled) as info:
                    await session.run("go")
                assert info.value.checkpoint == TOOL_CALL_CHECKPOINT

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.wait_all_tasks_blocked()
                session.cancel()
        check_pairing(session.conversation_messages, allow_pending=False)
        assert len(tool.calls) == 1


# ---------------------------------------------------------------------------------------
# capture and drivers


class TestCaptureAndDrivers:
    """capture_events, quiet_context, run_layer and run_tool_layer drive a layer alone."""

    def test_capture_events_filters_by_kind_or_class_and_stops_at_exit(self) -> None:
        ctx = quiet_context()
        with (
            capture_events() as everything,
            capture_events("run.started") as by_kind,
            capture_events(ModelStreamDelta) as by_class,
        ):
            ctx.emit(RunStarted())
            ctx.emit(ModelStreamDelta(text="x"))
        ctx.emit(RunStarted())
        assert [e.kind for e in everything] == ["run.started", "model.stream_delta"]
        assert [e.kind for e in by_kind] == ["run.started"]
        assert [e.kind for e in by_class] == ["model.stream_delta"]

    def test_quiet_context_holds_messages_and_logs_nothing(self) -> None:
        history = (UserMessage("a"), AssistantMessage("b"))
        ctx = quiet_context(history, data={"k": 1}, config=RunConfig(thread_id="t"))
        assert ctx.conversation.messages == history
        assert (ctx.data, ctx.thread_id) == ({"k": 1}, "t")
        with structlog.testing.capture_logs() as logs, capture_events() as events:
            ctx.emit(RunStarted())
        assert logs == [] and len(events) == 1
        with pytest.raises(TypeError, match="not both"):
            quiet_context(history, conversation=Conversation())

    async def test_run_layer_accepts_messages_and_mirrors_the_conversation(self) -> None:
        seen: list[tuple[Message, ...]] = []

        async def observe(
            request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
        ) -> ModelResponse:
            seen.append(ctx.conversation.messages)
            return await call_next(request, ctx)

        response = await run_layer(observe, [UserMessage("hi")])
        assert response.text == "ok"
        assert seen == [(UserMessage("hi"),)]

    async def test_run_tool_layer_defaults_and_custom_next(self) -> None:
        class Upper(Layer):
            async def wrap_tool(self, call: ToolCall, ctx: RunContext[Any], call_next: Any) -> Any:
                result = await call_next(call, ctx)
                return ToolResult.for_call(call, result.content.upper())

        async def core(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return ToolResult.for_call(call, "from core")

        assert (await run_tool_layer(Upper(), ToolCall("c", "t"))).content == "OK"
        assert (await run_tool_layer(Upper(), ToolCall("c", "t"), next=core)).content == (
            "FROM CORE"
        )


# ---------------------------------------------------------------------------------------
# invariants


class TestAssertPairingIntact:
    """assert_pairing_intact catches orphans and half-dropped units."""

    def test_orphans_and_pending_calls(self) -> None:
        opener = AssistantMessage("", (ToolCall("c1", "t"),))
        assert_pairing_intact([UserMessage("u"), opener])
        with pytest.raises(AssertionError, match="pairing broken: orphan tool call 'c1'"):
            assert_pairing_intact([UserMessage("u"), opener], allow_pending=False)
        with pytest.raises(AssertionError, match="orphan tool result"):
            assert_pairing_intact([ToolResult("zz", "r")])

    def test_a_dropped_result_is_caught_against_before(self) -> None:
        before = (AssistantMessage("", (ToolCall("c1", "t"),)), ToolResult("c1", "r"))
        assert_pairing_intact(before[:0], before)  # a whole unit may go
        with pytest.raises(AssertionError, match="answered before are pending after: \\['c1'\\]"):
            assert_pairing_intact(before[:1], before)


class TestAssertParentUnchanged:
    """assert_parent_unchanged catches any change a nested call makes to its parent."""

    async def test_derive_passes_and_returns_the_value(self) -> None:
        ctx = quiet_context(data=[1])
        child = await assert_parent_unchanged(ctx, lambda c: c.derive(tags=("x",)))
        assert child.parent_run_id == ctx.run_id

    @pytest.mark.parametrize(
        ("change", "key"),
        [
            (lambda c: c.request_control(StopWithFinal("x")), "control"),
            (lambda c: c.cancellation.cancel(), "cancelled"),
            (lambda c: c.data.append(2), "data"),
        ],
    )
    async def test_each_kind_of_change_is_named(self, change: Any, key: str) -> None:
        ctx = quiet_context(data=[1])
        with pytest.raises(AssertionError, match=f"parent context changed \\({key}\\)"):
            await assert_parent_unchanged(ctx, change)

    async def test_async_functions_are_awaited(self) -> None:
        async def nested(ctx: RunContext[Any]) -> str:
            await anyio.lowlevel.checkpoint()
            return ctx.derive().run_id

        assert await assert_parent_unchanged(quiet_context(), nested)


class TestAssertWithinBudget:
    """assert_within_budget checks a TokenCounter's count against the limit, clearly."""

    def test_within_budget_returns_the_count(self) -> None:
        counter = HeuristicCounter()
        request = ModelRequest(messages=(UserMessage("x" * 40),), system_prompt="be brief")
        count = assert_within_budget(request, counter, counter.count_request(request))
        assert count == counter.count_request(request)
        assert assert_within_budget([UserMessage("a")], counter, 100) == counter.count_messages(
            [UserMessage("a")]
        )

    def test_over_budget_names_count_limit_excess_and_largest_messages(self) -> None:
        counter = HeuristicCounter()
        request = ModelRequest(messages=(UserMessage("small"), ToolResult("c", "y" * 400)))
        count = counter.count_request(request)
        with pytest.raises(AssertionError) as info:
            assert_within_budget(request, counter, 10)
        text = str(info.value)
        assert f"{count} tokens > limit 10 (over by {count - 10}" in text
        assert "largest #1 tool" in text and "HeuristicCounter" in text

    def test_bad_arguments_are_named(self) -> None:
        with pytest.raises(TypeError, match="TokenCounter"):
            assert_within_budget([], object(), 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit"):
            assert_within_budget([], HeuristicCounter(), -1)

    @given(request=requests())
    def test_holds_at_the_exact_count_and_fails_one_below(self, request: ModelRequest) -> None:
        counter = HeuristicCounter()
        count = counter.count_request(request)
        assert_within_budget(request, counter, count)
        if count:
            with pytest.raises(AssertionError, match="over budget"):
                assert_within_budget(request, counter, count - 1)


class TestAssertIdempotent:
    """assert_idempotent checks f(f(x)) == f(x), sync or async, and shows the difference."""

    def test_sync(self) -> None:
        assert assert_idempotent(sorted, [3, 1, 2]) == [1, 2, 3]
        with pytest.raises(AssertionError, match="first difference at index 0"):
            assert_idempotent(lambda xs: [x + 1 for x in xs], [1, 2])
        with pytest.raises(AssertionError, match="length 1 -> 2"):
            assert_idempotent(lambda xs: [*xs, 0], [])

    async def test_async(self) -> None:
        async def strip(text: str) -> str:
            return text.strip()

        async def grow(text: str) -> str:
            return text + "!"

        assert await assert_idempotent(strip, "  x ") == "x"
        with pytest.raises(AssertionError, match="not idempotent"):
            await assert_idempotent(grow, "x")


class TestAssertEventsFormTree:
    """assert_events_form_tree accepts one tree and names what breaks it."""

    def test_a_tree_of_nested_runs(self) -> None:
        root = quiet_context()
        child = root.derive()
        grandchild = child.derive()
        with capture_events() as events:
            for ctx in (root, child, grandchild, child):
                ctx.emit(RunStarted())
        assert_events_form_tree(events)
        assert_events_form_tree([])

    def test_two_roots_unstamped_and_missing_lineage(self) -> None:
        with capture_events() as events:
            quiet_context().emit(RunStarted())
            quiet_context().emit(RunStarted())
        with pytest.raises(AssertionError, match="2 roots"):
            assert_events_form_tree(events)
        with pytest.raises(AssertionError, match="no run ids"):
            assert_events_form_tree([RunStarted()])
        orphan = RunStarted(run_id="b", root_run_id="a", parent_run_id="a")
        with pytest.raises(AssertionError, match="carries no lineage"):
            assert_events_form_tree([RunStarted(run_id="a", root_run_id="a"), orphan])
        two_parents = [
            RunStarted(run_id="c", root_run_id="a", parent_run_id="b", lineage=("a", "b")),
            RunStarted(run_id="c", root_run_id="a", parent_run_id="x", lineage=("a", "x")),
        ]
        with pytest.raises(AssertionError, match="two parents"):
            assert_events_form_tree(two_parents)
