"""tinyctx inside LangChain: lossless message conversion both ways, and TinyctxMiddleware
running default_stack() in create_agent's own loop over a real transcript."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from tinyctx import AssistantMessage, StopWithFinal, UserMessage
from tinyctx.formats import FormatError
from tinyctx.integrations.langchain import TinyctxMiddleware
from tinyctx.integrations.langchain_messages import (
    from_langchain,
    to_langchain,
    usage_from_langchain,
)
from tinyctx.messages import check_pairing
from tinyctx.middleware.stacks import default_stack
from tinyctx.testing.strategies import histories
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import default_counter

TRANSCRIPT = "transcripts/openai/marot__spotter__cc-subagent-a2898e3.jsonl"
WINDOW = 8000

_ids = st.text("abcdef0123456789", min_size=1, max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=4,
)
_extras = st.dictionaries(st.sampled_from(["a", "b", "refusal"]), _json, max_size=2)
_blocks = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=10)),
        st.builds(lambda t: {"type": "thinking", "thinking": t}, st.text(max_size=10)),
        st.just({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
    ),
    min_size=1,
    max_size=3,
)
_content = st.text(max_size=20) | _blocks


@st.composite
def _common(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "id": draw(st.none() | _ids),
        "name": draw(st.none() | st.text("xyz", min_size=1, max_size=3)),
        "additional_kwargs": draw(_extras),
        "response_metadata": draw(_extras),
    }


@st.composite
def lc_histories(draw: st.DrawFn) -> list[BaseMessage]:
    """LangChain histories of every message type with every field drawn; each call answered."""
    out: list[BaseMessage] = []
    if draw(st.booleans()):
        out.append(SystemMessage(draw(_content), **draw(_common())))
    for turn in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["human", "chat", "ai", "tools"]))
        if kind == "human":
            out.append(HumanMessage(draw(_content), **draw(_common())))
        elif kind == "chat":
            role = draw(st.sampled_from(["user", "critic", "system", "assistant"]))
            out.append(ChatMessage(draw(st.text(max_size=10)), role=role, **draw(_common())))
        elif kind == "ai":
            usage = draw(
                st.none()
                | st.builds(
                    lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
                    st.integers(0, 99),
                    st.integers(0, 99),
                )
            )
            out.append(AIMessage(draw(_content), usage_metadata=usage, **draw(_common())))
        else:
            n = draw(st.integers(1, 3))
            calls = [
                {
                    "name": "f",
                    "args": draw(st.dictionaries(st.text(max_size=3), _json, max_size=2)),
                    "id": f"t{turn}c{i}",
                    "type": "tool_call",
                }
                for i in range(n)
            ]
            bad = draw(st.booleans())
            invalid = (
                [
                    {
                        "name": "g",
                        "args": "{not json",
                        "id": f"t{turn}bad",
                        "error": "x",
                        "type": "invalid_tool_call",
                    }
                ]
                if bad
                else []
            )
            out.append(
                AIMessage(
                    draw(_content), tool_calls=calls, invalid_tool_calls=invalid, **draw(_common())
                )
            )
            answered = [c["id"] for c in calls] + [c["id"] for c in invalid]
            for call_id in draw(st.permutations(answered)):
                out.append(
                    ToolMessage(
                        draw(_content),
                        tool_call_id=call_id,
                        status=draw(st.sampled_from(["success", "error"])),
                        artifact=draw(st.none() | _json),
                        **draw(_common()),
                    )
                )
    return out


@pytest.fixture
def anyio_backend() -> str:
    """LangGraph runs on asyncio only (it starts asyncio tasks itself): these tests run there."""
    return "asyncio"


class TestConversion:
    """LangChain messages and tinyctx messages convert both ways without loss."""

    @given(lc_histories())
    def test_langchain_round_trip(self, messages: list[BaseMessage]) -> None:
        """LangChain -> tinyctx -> LangChain gives back every message, every field equal."""
        converted = from_langchain(messages)
        check_pairing(converted)
        assert to_langchain(converted) == messages

    @given(histories(media=0.3))
    def test_tinyctx_round_trip(self, history: tuple[Any, ...]) -> None:
        """tinyctx -> LangChain -> tinyctx gives back the history, metadata and parts included."""
        assert from_langchain(to_langchain(history)) == history

    def test_reused_call_ids_are_renamed_and_written_back(self) -> None:
        """A call id reused by a later turn is renamed in tinyctx and restored in LangChain."""
        messages: list[BaseMessage] = []
        for _ in range(2):
            messages.append(AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "call_0"}]))
            messages.append(ToolMessage("ok", tool_call_id="call_0"))
        converted = from_langchain(messages)
        check_pairing(converted)
        assert converted[2].tool_calls[0].id != "call_0"
        assert to_langchain(converted) == messages

    def test_a_tool_message_without_its_call_names_the_index(self) -> None:
        """An orphan ToolMessage is a FormatError naming its index."""
        with pytest.raises(FormatError, match="message 1"):
            from_langchain([HumanMessage("hi"), ToolMessage("x", tool_call_id="nope")])

    def test_function_messages_are_refused_naming_the_type(self) -> None:
        """A legacy FunctionMessage (no call id) is refused with the allowed types."""
        with pytest.raises(FormatError, match="'function'.*allowed"):
            from_langchain([FunctionMessage("x", name="f")])

    def test_usage_metadata_becomes_usage(self) -> None:
        """usage_metadata's prompt, output, cache reads and reasoning become a Usage."""
        message = AIMessage(
            "x",
            usage_metadata={
                "input_tokens": 10,
                "output_tokens": 4,
                "total_tokens": 14,
                "input_token_details": {"cache_read": 6},
                "output_token_details": {"reasoning": 2},
            },
        )
        usage = usage_from_langchain(message)
        assert usage is not None
        assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (10, 4, 6)
        assert usage.reasoning_tokens == 2


_EDITS = st.sampled_from(["content", "kwargs", "metadata", "args", "name"])


def _edit(message: BaseMessage, how: str) -> None:
    """Change ``message`` in place, the way application code may."""
    if how == "content":
        message.content = f"{message.content!r} edited"
    elif how == "kwargs":
        message.additional_kwargs["edited"] = True
    elif how == "metadata":
        message.response_metadata["edited"] = [1, 2]
    elif how == "args" and isinstance(message, AIMessage) and message.tool_calls:
        message.tool_calls[0]["args"]["edited"] = "yes"
    else:
        message.name = "edited"


class TestConversionMemo:
    """A history re-sent on every call is converted once; an edit in place is never
    answered from what an earlier call converted."""

    def test_an_unchanged_message_reads_as_the_same_object(self) -> None:
        messages = [HumanMessage("hi"), AIMessage("hello")]
        first = from_langchain(messages)
        again = from_langchain(messages)
        assert all(a is b for a, b in zip(first, again, strict=True))

    @given(lc_histories(), st.data())
    def test_an_edited_message_is_read_again(self, messages: list[BaseMessage], data: Any) -> None:
        """After any in-place edit, the reading equals that of fresh copies."""
        from_langchain(messages)  # the memo holds every message now
        if messages:
            target = data.draw(st.sampled_from(messages))
            _edit(target, data.draw(_EDITS))
        fresh = [m.model_copy(deep=True) for m in messages]
        assert from_langchain(messages) == from_langchain(fresh)

    def test_an_extra_field_set_later_is_read(self) -> None:
        """An undeclared field (kept outside __dict__) is never vouched for by the memo."""
        message = HumanMessage("hi")
        (before,) = from_langchain([message])
        message.note = "later"  # type: ignore[attr-defined]
        (after,) = from_langchain([message])
        assert after != before and after.metadata["langchain"]["note"] == "later"

    @given(histories(media=0.3), _EDITS)
    def test_an_edited_written_message_is_written_again(
        self, history: tuple[Any, ...], how: str
    ) -> None:
        """A LangChain message handed out and then edited is not handed out again: the
        next writing says what the tinyctx message says."""
        written = to_langchain(history)
        for message in written:
            _edit(message, how)
        assert to_langchain(history) == to_langchain(tuple(attrs.evolve(m) for m in history))

    def test_an_unedited_written_message_is_handed_out_again(self) -> None:
        """As LangGraph hands the same state objects to every call."""
        history = (UserMessage("hi"), AssistantMessage("hello"))
        first = to_langchain(history)
        assert all(a is b for a, b in zip(first, to_langchain(history), strict=True))

    def test_the_memo_lets_messages_go(self) -> None:
        """A converted message that nothing else holds is freed, and so is its reading."""
        message = HumanMessage("x" * 1000)
        (read,) = from_langchain([message])
        gone, reading = weakref.ref(message), weakref.ref(read)
        del message, read
        gc.collect()
        assert gone() is None and reading() is None


class _FakeModel(GenericFakeChatModel):
    """LangChain's generic fake chat model, accepting tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class _Recorder(AgentMiddleware):  # type: ignore[type-arg]
    """Sits inside TinyctxMiddleware and keeps every request the model gets."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[list[BaseMessage]] = []

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        self.requests.append(list(request.messages))
        return await handler(request)


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}: " + "z" * 12_000


def _script(turns: int) -> list[AIMessage]:
    calls = [
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"query": str(i)}, "id": f"new{i}"}])
        for i in range(turns)
    ]
    return [*calls, AIMessage("all done")]


def _transcript(shared_data: Path) -> list[BaseMessage]:
    return to_langchain(load_openai_jsonl(shared_data / TRANSCRIPT))


def _assert_inside_window(requests: list[list[BaseMessage]]) -> None:
    counter = default_counter()
    for sent in requests:
        history = from_langchain(sent)
        check_pairing(history, allow_pending=False)
        assert counter.count_messages(history) <= WINDOW


class TestMiddleware:
    """TinyctxMiddleware runs the stack in create_agent's loop with LangChain's fake model."""

    async def test_default_stack_keeps_every_request_in_the_window(
        self, shared_data: Path, anyio_backend: str
    ) -> None:
        """Over a real transcript, every request fits, pairing holds, and the checkpointer
        (InMemorySaver) stores the history tinyctx committed."""
        recorder = _Recorder()
        middleware = TinyctxMiddleware(default_stack(), max_tokens=WINDOW)
        agent = create_agent(
            _FakeModel(messages=iter(_script(3))),
            tools=[lookup],
            middleware=[middleware, recorder],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t1"}}
        history = _transcript(shared_data)
        out = await agent.ainvoke({"messages": [*history, HumanMessage("go on")]}, config)
        assert len(recorder.requests) == 4
        _assert_inside_window(recorder.requests)
        stored = (await agent.aget_state(config)).values["messages"]
        assert len(stored) < len(history)  # the summary was committed to the graph
        committed = middleware.stack.context("t1").conversation.messages
        assert from_langchain(stored)[: len(committed)] == committed
        assert out["messages"][-1].content == "all done"

    async def test_sqlite_checkpointer_stores_the_commit(
        self, shared_data: Path, tmp_path: Path, anyio_backend: str
    ) -> None:
        """With SqliteSaver the committed summary is what a new graph reads back."""
        middleware = TinyctxMiddleware(default_stack(), max_tokens=WINDOW)
        config: Any = {"configurable": {"thread_id": "t2"}}
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "lg.db")) as saver:
            agent = create_agent(
                _FakeModel(messages=iter(_script(1))),
                tools=[lookup],
                middleware=[middleware],
                checkpointer=saver,
            )
            history = _transcript(shared_data)
            await agent.ainvoke({"messages": [*history, HumanMessage("go on")]}, config)
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "lg.db")) as saver:
            agent = create_agent(_FakeModel(messages=iter([])), tools=[lookup], checkpointer=saver)
            stored = from_langchain((await agent.aget_state(config)).values["messages"])
        committed = middleware.stack.context("t2").conversation.messages
        assert stored[: len(committed)] == committed
        assert any("summary" in (m.metadata.get("tinyctx") or {}) for m in stored)

    async def test_a_transient_rewrite_leaves_the_graph_state_alone(
        self, anyio_backend: str
    ) -> None:
        """A layer that only edits the request changes what the model got, not the state."""

        async def shout(request: Any, ctx: Any, call_next: Any) -> Any:
            edited = [m.evolve(content=m.content.upper()) for m in request.messages]
            return await call_next(request.evolve(messages=edited), ctx)

        recorder = _Recorder()
        agent = create_agent(
            _FakeModel(messages=iter([AIMessage("fine")])),
            middleware=[TinyctxMiddleware([shout]), recorder],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t3"}}
        await agent.ainvoke({"messages": [HumanMessage("hello")]}, config)
        assert recorder.requests[0][0].content == "HELLO"
        stored = (await agent.aget_state(config)).values["messages"]
        assert [m.content for m in stored] == ["hello", "fine"]

    async def test_an_unchanged_request_reaches_the_model_as_the_graphs_own_messages(
        self, anyio_backend: str
    ) -> None:
        """Layers that pass the request on as it came hand LangChain's handler the graph's
        own message objects (its ids and fields as they are), on every call."""

        async def passing(request: Any, ctx: Any, call_next: Any) -> Any:
            return await call_next(request, ctx)

        recorder = _Recorder()
        agent = create_agent(
            _FakeModel(messages=iter(_script(2))),
            tools=[lookup],
            middleware=[TinyctxMiddleware([passing]), recorder],
        )
        first = HumanMessage("hello", id="h-1", additional_kwargs={"trace": "t"})
        out = await agent.ainvoke({"messages": [first]})
        assert len(recorder.requests) == 3
        assert recorder.requests[0][0] is first
        final = out["messages"]
        for sent in recorder.requests:
            assert all(m is final[i] for i, m in enumerate(sent))
            assert len(sent) < len(final)

    async def test_stop_with_final_ends_the_run_with_its_text(self, anyio_backend: str) -> None:
        """A layer's StopWithFinal ends LangChain's loop with its text, no call left open."""

        async def stop(request: Any, ctx: Any, call_next: Any) -> Any:
            response = await call_next(request, ctx)
            ctx.request_control(StopWithFinal("stopped here"))
            return response

        script = [AIMessage("", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "a"}])]
        agent = create_agent(
            _FakeModel(messages=iter(script)),
            tools=[lookup],
            middleware=[TinyctxMiddleware([stop])],
        )
        out = await agent.ainvoke({"messages": [HumanMessage("hello")]})
        assert out["messages"][-1].content == "stopped here"
        assert not out["messages"][-1].tool_calls

    def test_sync_invoke_runs_the_stack(self) -> None:
        """A synchronous invoke runs the model and tool onions too (tool results budgeted)."""
        agent = create_agent(
            _FakeModel(messages=iter(_script(1))),
            tools=[lookup],
            middleware=[TinyctxMiddleware(default_stack(), max_tokens=WINDOW)],
        )
        out = agent.invoke({"messages": [HumanMessage("hello")]})
        result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
        assert len(result.content.encode()) < 12_000  # cut: too big to enter whole
        assert out["messages"][-1].content == "all done"


class TestHistory:
    """A LangGraph thread imports into a tinyctx thread and exports back unchanged."""

    async def test_import_then_export_round_trips(self, tmp_path: Path) -> None:
        """The checkpointer's messages land in the tinyctx store and come back equal."""
        from tinyctx import SqliteStore
        from tinyctx.integrations.langchain import export_langgraph, import_langgraph

        agent = create_agent(
            _FakeModel(messages=iter(_script(1))), tools=[lookup], checkpointer=InMemorySaver()
        )
        config: Any = {"configurable": {"thread_id": "lg"}}
        await agent.ainvoke({"messages": [HumanMessage("hello")]}, config)
        original = (await agent.aget_state(config)).values["messages"]
        store = SqliteStore(tmp_path / "t.db")
        imported = await import_langgraph(agent, "lg", store)
        assert imported == from_langchain(original)
        exported = await export_langgraph(store, "lg", agent, into="lg2")
        assert exported == original
        copy = (await agent.aget_state({"configurable": {"thread_id": "lg2"}})).values
        assert copy["messages"] == original


class TestControl:
    """Control outcomes map to LangGraph's own."""

    async def test_an_interrupt_pauses_the_graph(self) -> None:
        """A layer's Interrupt becomes a LangGraph interrupt carrying node and message."""
        from tinyctx import Interrupt

        async def pause(request: Any, ctx: Any, call_next: Any) -> Any:
            ctx.request_control(Interrupt("review", "look first"))
            return await call_next(request, ctx)

        agent = create_agent(
            _FakeModel(messages=iter([AIMessage("fine")])),
            middleware=[TinyctxMiddleware([pause])],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "int"}}
        out = await agent.ainvoke({"messages": [HumanMessage("hello")]}, config)
        (paused,) = out["__interrupt__"]
        assert paused.value["node"] == "review"
        assert paused.value["message"] == "look first"

    async def test_resuming_the_interrupt_runs_the_model_node_again(self) -> None:
        """``Command(resume=...)`` re-runs the model node: the model is called again, the
        interrupt returns the resume value instead of pausing, and the run finishes with
        that call's answer."""
        from langgraph.types import Command

        from tinyctx import Interrupt

        async def pause(request: Any, ctx: Any, call_next: Any) -> Any:
            ctx.request_control(Interrupt("review", "look first"))
            return await call_next(request, ctx)

        model = _FakeModel(messages=iter([AIMessage("first"), AIMessage("second")]))
        agent = create_agent(
            model, middleware=[TinyctxMiddleware([pause])], checkpointer=InMemorySaver()
        )
        config: Any = {"configurable": {"thread_id": "resume"}}
        paused = await agent.ainvoke({"messages": [HumanMessage("hello")]}, config)
        assert "__interrupt__" in paused
        done = await agent.ainvoke(Command(resume="go on"), config)
        assert "__interrupt__" not in done
        assert [m.content for m in done["messages"]] == ["hello", "second"]

    async def test_a_review_pauses_and_never_runs_the_call_unreviewed(self) -> None:
        """Approvals' pause (a structured payload) is stored by the checkpointer as plain
        data; a resume carries no per-call decision, so the reviewed call is answered as
        not reviewed and its tool never runs."""
        from langgraph.types import Command

        from tinyctx.middleware import Approvals

        ran: list[str] = []

        @tool
        def wipe(path: str) -> str:
            """Wipe a path."""
            ran.append(path)
            return "wiped"

        call = {"name": "wipe", "args": {"path": "/"}, "id": "w1"}
        model = _FakeModel(
            messages=iter([AIMessage("", tool_calls=[call]), AIMessage("", tool_calls=[call])])
        )
        agent = create_agent(
            model,
            tools=[wipe],
            middleware=[TinyctxMiddleware([Approvals("wipe")])],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "review"}}
        paused = await agent.ainvoke({"messages": [HumanMessage("clean")]}, config)
        (pause,) = paused["__interrupt__"]
        assert pause.value["payload"]["calls"][0]["id"] == "w1"
        assert type(pause.value["payload"]) is dict
        model.messages = iter([AIMessage("", tool_calls=[call]), AIMessage("left it")])
        done = await agent.ainvoke(Command(resume="approve"), config)
        assert ran == []
        (answer,) = [m for m in done["messages"] if isinstance(m, ToolMessage)]
        assert "needs human review" in answer.content
        assert done["messages"][-1].content == "left it"
