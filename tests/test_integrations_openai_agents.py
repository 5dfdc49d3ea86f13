"""tinyctx inside the OpenAI Agents SDK: lossless item conversion, TinyctxSession on
tinyctx's thread stores, and TinyctxInputFilter / TinyctxModel running default_stack() in
the SDK's own agent loop with its ScriptedModel over a real transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from tests.servers import BACKENDS, make_backend
from tinyctx import Interrupt, MemoryStore, SqliteStore, StopWithFinal, ToolResult
from tinyctx.codec import encode_message
from tinyctx.formats import FormatError
from tinyctx.formats._common import core
from tinyctx.integrations import StackInterrupted
from tinyctx.integrations.openai_agents import (
    TinyctxInputFilter,
    TinyctxModel,
    TinyctxSession,
)
from tinyctx.integrations.openai_agents_items import from_agents_items, to_agents_items
from tinyctx.messages import check_pairing
from tinyctx.middleware.stacks import default_stack
from tinyctx.testing.strategies import histories
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.threads import ThreadWrite
from tinyctx.tokens import default_counter

TRANSCRIPT = "transcripts/openai/marot__spotter__cc-subagent-a2898e3.jsonl"
WINDOW = 8000

_text = st.text(max_size=12)
_ids = st.text("abcdef0123456789", min_size=1, max_size=6)


@st.composite
def _input_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "system", "developer"]))
    if role == "user" and draw(st.booleans()):
        content: Any = [{"type": "input_text", "text": draw(st.text(min_size=1, max_size=9))}]
    else:
        content = draw(_text)
    item: dict[str, Any] = {"role": role, "content": content}
    if draw(st.booleans()):
        item["type"] = "message"
    if draw(st.booleans()):
        item["id"] = "m" + draw(_ids)
    return item


@st.composite
def agents_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    """SDK input item lists: easy and typed input messages of every role, reasoning items,
    assistant messages with ids and status, function calls and their outputs, hosted
    tool calls; every call answered."""
    items: list[dict[str, Any]] = [draw(_input_message())]
    for turn in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            summary = [{"type": "summary_text", "text": draw(_text)}]
            items.append({"id": f"rs{turn}", "type": "reasoning", "summary": summary})
        if draw(st.booleans()):
            items.append({"id": f"ws{turn}", "type": "web_search_call", "status": "completed"})
        calls = [f"t{turn}c{i}" for i in range(draw(st.integers(0, 2)))]
        if draw(st.booleans()) or not calls:
            # (an empty output_text part is refused by the Responses item reader)
            said = draw(st.text(min_size=1, max_size=12))
            text = {"type": "output_text", "text": said, "annotations": []}
            items.append(
                {
                    "id": f"msg{turn}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [text],
                }
            )
        for call in calls:
            items.append(
                {
                    "id": f"fc{call}",
                    "type": "function_call",
                    "call_id": call,
                    "name": "f",
                    "arguments": draw(st.sampled_from(['{"a": 1}', "{}", "{bad"])),
                }
            )
        for call in draw(st.permutations(calls)):
            items.append({"type": "function_call_output", "call_id": call, "output": draw(_text)})
        if draw(st.booleans()):
            items.append(draw(_input_message()))
    return items


def _said(message: Any) -> Any:
    plain = core(message)
    return plain.evolve(is_error=False) if isinstance(plain, ToolResult) else plain


@pytest.fixture
def anyio_backend() -> str:
    """The Agents SDK runs on asyncio only: these tests run there."""
    return "asyncio"


class TestConversion:
    """Agents SDK items and tinyctx messages convert both ways without loss."""

    @given(agents_items())
    def test_items_round_trip(self, items: list[dict[str, Any]]) -> None:
        """SDK items -> tinyctx -> SDK items gives back every item, every field equal."""
        messages = from_agents_items(items)
        check_pairing(messages)
        assert to_agents_items(messages) == items

    @given(histories(media=0))
    def test_tinyctx_round_trip(self, history: tuple[Any, ...]) -> None:
        """tinyctx -> items -> tinyctx keeps every call, result and text, and is exact from
        then on (items are what the API takes: tinyctx's metadata, essential and error flags
        stay local, and an answer right before a turn of calls is one turn on the wire)."""
        back = from_agents_items(to_agents_items(history))
        assert from_agents_items(to_agents_items(back)) == back
        check_pairing(back)
        results = [_said(m) for m in history if isinstance(m, ToolResult)]
        assert [_said(m) for m in back if isinstance(m, ToolResult)] == results
        said = "".join(m.text for m in history if not isinstance(m, ToolResult))
        assert "".join(m.text for m in back if not isinstance(m, ToolResult)) == said

    def test_an_orphan_output_names_its_index(self) -> None:
        """A function_call_output that answers no call is a FormatError naming its index."""
        with pytest.raises(FormatError, match="message 1"):
            from_agents_items(
                [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call_output", "call_id": "x", "output": "y"},
                ]
            )


def _transcript(shared_data: Path) -> tuple[Any, ...]:
    return load_openai_jsonl(shared_data / TRANSCRIPT)


@function_tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}: " + "z" * 4000


def _script(calls: int) -> ScriptedModel:
    steps: list[Any] = [
        [function_call("lookup", {"query": str(i)}, call_id=f"new{i}")] for i in range(calls)
    ]
    return ScriptedModel([*steps, [assistant_message("all done")]])


async def _stored_thread(store: Any, thread: str, shared_data: Path) -> None:
    documents = tuple(encode_message(m) for m in _transcript(shared_data))
    await store.write(thread, ThreadWrite(append=documents), expected_version=0)


def _assert_inside_window(model: ScriptedModel) -> None:
    counter = default_counter()
    for call in model.calls:
        messages = from_agents_items(call.input)
        check_pairing(messages, allow_pending=False)
        assert counter.count_messages(messages) <= WINDOW


class TestSession:
    """TinyctxSession keeps an Agents SDK conversation in a tinyctx thread store."""

    @pytest.fixture(params=BACKENDS)
    async def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
        """Every thread store backend, PostgreSQL and Redis on real servers."""
        backend = make_backend(request.param, request, tmp_path)
        yield backend
        await backend.aclose()

    async def test_items_round_trip_through_the_store(self, store: Any) -> None:
        """What add_items wrote, get_items reads back; pop_item takes the newest item."""
        session = TinyctxSession("s", store)
        first = [{"role": "user", "content": "hi"}]
        turn = [
            {"id": "rs", "type": "reasoning", "summary": []},
            {"id": "fc", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]
        answer = [{"type": "function_call_output", "call_id": "c", "output": "ok"}]
        await session.add_items(first)
        await session.add_items(turn)
        await session.add_items(answer)
        assert await session.get_items() == [*first, *turn, *answer]
        assert await session.get_items(limit=2) == [turn[-1], *answer]
        assert await session.pop_item() == answer[0]
        assert await session.pop_item() == turn[1]
        assert await TinyctxSession("s", store).get_items() == [*first, turn[0]]
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None

    async def test_two_sessions_on_one_thread_lose_nothing(self, store: Any) -> None:
        """A write from a stale read is retried on the fresh thread, never lost."""
        one, two = TinyctxSession("s", store), TinyctxSession("s", store)
        await one.add_items([{"role": "user", "content": "a"}])
        await two.get_items()
        await one.add_items([{"role": "user", "content": "b"}])
        await two.add_items([{"role": "user", "content": "c"}])
        contents = [item["content"] for item in await one.get_items()]
        assert contents == ["a", "b", "c"]


class TestInputFilter:
    """TinyctxInputFilter runs the stack on each model call of the SDK's own loop."""

    async def test_default_stack_keeps_every_call_in_the_window(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        """Over a real transcript in a TinyctxSession every call fits and pairs, and the
        session's thread holds the compaction tinyctx committed (originals archived)."""
        store = SqliteStore(tmp_path / "t.db")
        await _stored_thread(store, "s1", shared_data)
        session = TinyctxSession("s1", store)
        model = _script(3)
        config = RunConfig(
            call_model_input_filter=TinyctxInputFilter(
                default_stack(), max_tokens=WINDOW, session=session
            ),
            tracing_disabled=True,
        )
        agent = Agent(name="a", model=model, tools=[lookup])
        result = await Runner.run(agent, "go on", session=session, run_config=config)
        assert result.final_output == "all done"
        assert len(model.calls) == 4
        _assert_inside_window(model)
        stored = (await store.load_thread("s1")).messages
        assert len(stored) < len(_transcript(shared_data))
        assert await store.archived("s1")
        check_pairing(session.messages)

    async def test_a_transient_rewrite_leaves_the_session_alone(self, tmp_path: Path) -> None:
        """A layer that only edits what is sent changes the model's input, not the thread."""

        async def shout(request: Any, ctx: Any, call_next: Any) -> Any:
            edited = [m.evolve(content=m.content.upper()) for m in request.messages]
            return await call_next(request.evolve(messages=edited), ctx)

        session = TinyctxSession("s2", MemoryStore())
        model = ScriptedModel([[assistant_message("fine")]])
        config = RunConfig(
            call_model_input_filter=TinyctxInputFilter([shout]), tracing_disabled=True
        )
        await Runner.run(Agent(name="a", model=model), "hello", session=session, run_config=config)
        assert model.calls[0].input[0]["content"] == "HELLO"
        assert (await session.get_items())[0]["content"] == "hello"


class TestModelWrapper:
    """TinyctxModel runs the stack around the model itself."""

    async def test_default_stack_with_usage_and_a_session(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        """Around the SDK's ScriptedModel every call fits and pairs, and the run finishes."""
        store = SqliteStore(tmp_path / "t.db")
        await _stored_thread(store, "s3", shared_data)
        session = TinyctxSession("s3", store)
        inner = _script(2)
        model = TinyctxModel(inner, default_stack(), max_tokens=WINDOW, session=session)
        agent = Agent(name="a", model=model, tools=[lookup])
        result = await Runner.run(
            agent, "go on", session=session, run_config=RunConfig(tracing_disabled=True)
        )
        assert result.final_output == "all done"
        _assert_inside_window(inner)
        assert await store.archived("s3")

    async def test_stop_with_final_and_interrupt(self) -> None:
        """StopWithFinal answers with its text; an Interrupt raises StackInterrupted."""

        async def stop(request: Any, ctx: Any, call_next: Any) -> Any:
            response = await call_next(request, ctx)
            ctx.request_control(StopWithFinal("stopped"))
            return response

        async def pause(request: Any, ctx: Any, call_next: Any) -> Any:
            ctx.request_control(Interrupt("review", "look first"))
            return await call_next(request, ctx)

        config = RunConfig(tracing_disabled=True)
        model = TinyctxModel(_script(1), [stop])
        result = await Runner.run(
            Agent(name="a", model=model, tools=[lookup]), "hi", run_config=config
        )
        assert result.final_output == "stopped"
        with pytest.raises(StackInterrupted, match="review"):
            await Runner.run(
                Agent(name="a", model=TinyctxModel(_script(0), [pause])), "hi", run_config=config
            )


class TestHistory:
    """An Agents SDK SQLiteSession imports into a tinyctx thread and exports back."""

    async def test_import_then_export_round_trips(self, tmp_path: Path) -> None:
        """The SDK session's items land in the store and export back equal."""
        from agents import SQLiteSession

        from tinyctx.integrations.openai_agents_session import export_session, import_session

        sdk = SQLiteSession("conv", str(tmp_path / "sdk.db"))
        model = _script(1)
        await Runner.run(
            Agent(name="a", model=model, tools=[lookup]),
            "hello",
            session=sdk,
            run_config=RunConfig(tracing_disabled=True),
        )
        original = await sdk.get_items()
        store = SqliteStore(tmp_path / "t.db")
        imported = await import_session(sdk, store)
        assert imported == from_agents_items(original)
        copy = SQLiteSession("copy", str(tmp_path / "sdk.db"))
        await export_session(store, "conv", copy)
        assert await copy.get_items() == original
        sdk.close()
        copy.close()
