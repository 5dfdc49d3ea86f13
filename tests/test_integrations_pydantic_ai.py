"""tinyctx inside pydantic-ai: lossless ModelMessage conversion, and TinyctxCapability
running default_stack() in pydantic-ai's own agent loop with FunctionModel over a real
transcript, usage fed back to the guard."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RequestUsage,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from tinyctx import Message, StopWithFinal
from tinyctx.formats import FormatError
from tinyctx.integrations import StackInterrupted
from tinyctx.integrations.pydantic_ai import TinyctxCapability, history_processor
from tinyctx.integrations.pydantic_ai_messages import (
    PYDANTIC_AI,
    from_pydantic_ai,
    to_pydantic_ai,
)
from tinyctx.messages import check_pairing
from tinyctx.middleware.budget import BudgetGuard
from tinyctx.middleware.stacks import default_stack
from tinyctx.testing.strategies import histories
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import default_counter

TRANSCRIPT = "transcripts/openai/marot__spotter__cc-subagent-a2898e3.jsonl"
WINDOW = 8000

_text = st.text(max_size=12)
_json = st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2)


def _retry(content: str, name: str | None, call_id: str) -> RetryPromptPart:
    with warnings.catch_warnings():  # deprecated in pydantic-ai 2.x, still in histories
        warnings.simplefilter("ignore")
        if name is None:
            return RetryPromptPart(content)
        return RetryPromptPart(content, tool_name=name, tool_call_id=call_id)


@st.composite
def pa_histories(draw: st.DrawFn) -> list[ModelMessage]:
    """pydantic-ai histories with every request and response part kind; calls answered."""
    out: list[ModelMessage] = []
    parts: list[Any] = []
    if draw(st.booleans()):
        parts.append(SystemPromptPart(draw(_text)))
    user = draw(_text | st.lists(_text | st.just(ImageUrl("https://e.com/a.png")), max_size=2))
    parts.append(UserPromptPart(user))
    out.append(ModelRequest(parts=parts, instructions=draw(st.none() | _text)))
    for turn in range(draw(st.integers(0, 3))):
        calls = [
            ToolCallPart("f", draw(_json | st.just("{bad")), tool_call_id=f"t{turn}c{i}")
            for i in range(draw(st.integers(0, 2)))
        ]
        head: list[Any] = [ThinkingPart(draw(_text))] if draw(st.booleans()) else []
        texts = [TextPart(draw(_text))] if draw(st.booleans()) or not calls else []
        usage = RequestUsage(input_tokens=draw(st.integers(0, 99)), output_tokens=3)
        out.append(ModelResponse(parts=[*head, *texts, *calls], usage=usage, model_name="m"))
        answers: list[Any] = []
        for call in calls:
            if draw(st.booleans()):
                content = draw(_text | _json)
                outcome = draw(st.sampled_from(["success", "failed"]))
                answers.append(
                    ToolReturnPart("f", content, tool_call_id=call.tool_call_id, outcome=outcome)
                )
            else:
                answers.append(_retry(draw(_text), "f", call.tool_call_id))
        if draw(st.booleans()):
            answers.append(
                _retry(draw(_text), None, "")
                if draw(st.booleans())
                else UserPromptPart(draw(_text))
            )
        if answers:
            out.append(ModelRequest(parts=answers))
    return out


def _without_kept(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    return tuple(
        m.evolve(metadata={k: v for k, v in m.metadata.items() if k != PYDANTIC_AI})
        for m in messages
    )


@pytest.fixture
def anyio_backend() -> str:
    """pydantic-ai runs on asyncio only (it starts asyncio tasks itself): these tests run there."""
    return "asyncio"


class TestConversion:
    """pydantic-ai messages and tinyctx messages convert both ways without loss."""

    @given(pa_histories())
    def test_pydantic_ai_round_trip(self, messages: list[ModelMessage]) -> None:
        """pydantic-ai -> tinyctx -> pydantic-ai gives back every message and part (as
        pydantic-ai's own loader reads them: it migrates a deprecated tool-less retry prompt)."""
        messages = ModelMessagesTypeAdapter.validate_python(
            ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        )
        converted = from_pydantic_ai(messages)
        check_pairing(converted)
        back = to_pydantic_ai(converted)
        dump = ModelMessagesTypeAdapter.dump_python
        assert dump(back, mode="json") == dump(messages, mode="json")
        assert back == messages

    @given(histories(media=0))
    def test_tinyctx_round_trip(self, history: tuple[Message, ...]) -> None:
        """tinyctx -> pydantic-ai -> tinyctx gives back the history (metadata and
        essential included), plus what pydantic-ai added (timestamps) kept aside."""
        assert _without_kept(from_pydantic_ai(to_pydantic_ai(history))) == history

    def test_an_orphan_tool_return_names_its_index(self) -> None:
        """A tool return that answers no call is a FormatError naming the message."""
        orphan = ModelRequest(parts=[ToolReturnPart("f", "x", tool_call_id="nope")])
        with pytest.raises(FormatError, match="message 1"):
            from_pydantic_ai([ModelRequest(parts=[UserPromptPart("hi")]), orphan])

    def test_an_edited_tool_result_is_written_as_a_real_part(self) -> None:
        """A layer's rewrite of a result's content is what the part says on the way back."""
        history = from_pydantic_ai(
            [
                ModelRequest(parts=[UserPromptPart("hi")]),
                ModelResponse(parts=[ToolCallPart("f", {}, tool_call_id="a")]),
                ModelRequest(parts=[ToolReturnPart("f", {"big": "x"}, tool_call_id="a")]),
            ]
        )
        cleared = (*history[:2], history[2].evolve(content="[cleared]"))
        part = to_pydantic_ai(cleared)[2].parts[0]
        assert isinstance(part, ToolReturnPart)
        assert part.content == "[cleared]"


_EDITS = st.sampled_from(["part", "parts", "args", "field"])


def _edit(message: ModelMessage, how: str) -> None:
    """Change ``message`` in place, the way application code may."""
    parts = message.parts
    if how == "part" and parts and hasattr(parts[0], "content"):
        parts[0].content = f"{parts[0].content!r} edited"  # type: ignore[union-attr]
    elif how == "parts" and isinstance(parts, list):
        parts.append(
            TextPart("added") if isinstance(message, ModelResponse) else UserPromptPart("added")
        )
    elif how == "args" and any(
        isinstance(p, ToolCallPart) and isinstance(p.args, dict) for p in parts
    ):
        call = next(p for p in parts if isinstance(p, ToolCallPart) and isinstance(p.args, dict))
        assert isinstance(call.args, dict)
        call.args["edited"] = 1
    elif isinstance(message, ModelResponse):
        message.model_name = "edited"
    else:
        message.instructions = "edited"


def _copies(messages: list[ModelMessage]) -> list[ModelMessage]:
    with warnings.catch_warnings():  # copying builds the deprecated RetryPromptPart again
        warnings.simplefilter("ignore")
        return copy.deepcopy(messages)


class TestConversionMemo:
    """A history re-sent on every call is converted once; an edit in place is never
    answered from what an earlier call converted."""

    def test_an_unchanged_message_reads_as_the_same_objects(self) -> None:
        messages = [ModelRequest(parts=[SystemPromptPart("s"), UserPromptPart("hi")])]
        first = from_pydantic_ai(messages)
        again = from_pydantic_ai(messages)
        assert len(first) == 2 and all(a is b for a, b in zip(first, again, strict=True))

    @given(pa_histories(), st.data())
    def test_an_edited_message_is_read_again(self, messages: list[ModelMessage], data: Any) -> None:
        """After any in-place edit, the reading equals that of fresh copies."""
        from_pydantic_ai(messages)  # the memo holds every message now
        _edit(data.draw(st.sampled_from(messages)), data.draw(_EDITS))
        assert from_pydantic_ai(messages) == from_pydantic_ai(_copies(messages))

    @given(pa_histories(), _EDITS)
    def test_an_edited_written_message_is_written_again(
        self, messages: list[ModelMessage], how: str
    ) -> None:
        """A pydantic-ai message handed out and then edited is not handed out again."""
        history = from_pydantic_ai(messages)
        for message in to_pydantic_ai(history):
            _edit(message, how)
        fresh = tuple(m.evolve() for m in history)
        assert to_pydantic_ai(history) == to_pydantic_ai(fresh)

    def test_an_unedited_written_message_is_handed_out_again(self) -> None:
        history = from_pydantic_ai([ModelRequest(parts=[UserPromptPart("hi")])])
        first = to_pydantic_ai(history)
        assert to_pydantic_ai(history)[0] is first[0]

    def test_a_request_made_of_other_messages_is_written_anew(self) -> None:
        """The memo is keyed by a request's first message; a different run of messages
        after it makes another request."""
        system, user = from_pydantic_ai(
            [ModelRequest(parts=[SystemPromptPart("s"), UserPromptPart("u")])]
        )
        (both,) = to_pydantic_ai((system, user))
        (alone,) = to_pydantic_ai((system,))
        assert len(both.parts) == 2 and len(alone.parts) == 1


def _transcript(shared_data: Path) -> list[ModelMessage]:
    return to_pydantic_ai(load_openai_jsonl(shared_data / TRANSCRIPT))


def _scripted(seen: list[list[ModelMessage]], calls: int) -> FunctionModel:
    """A FunctionModel that calls `lookup` ``calls`` times, then answers; it reports the
    prompt tokens it got (as a provider would), so the guard calibrates on them."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        prompt = default_counter().count_messages(from_pydantic_ai(messages))
        usage = RequestUsage(input_tokens=prompt, output_tokens=5)
        if len(seen) <= calls:
            call = ToolCallPart("lookup", {"query": str(len(seen))}, tool_call_id=f"new{len(seen)}")
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart("all done")], usage=usage)

    return FunctionModel(respond)


def _agent(model: Any, capability: TinyctxCapability) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(model, capabilities=[capability])

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look something up."""
        return f"result for {query}: " + "z" * 12_000

    return agent


class TestCapability:
    """TinyctxCapability runs the stack in pydantic-ai's loop."""

    async def test_default_stack_keeps_every_request_in_the_window(
        self, shared_data: Path, anyio_backend: str
    ) -> None:
        """Over a real transcript every request fits and pairs, the committed summary is
        the run's history, and the guard calibrated on the reported usage."""
        seen: list[list[ModelMessage]] = []
        capability = TinyctxCapability(default_stack(), max_tokens=WINDOW)
        agent = _agent(_scripted(seen, 3), capability)
        history = _transcript(shared_data)
        result = await agent.run("go on", message_history=history, conversation_id="c1")
        assert result.output == "all done"
        assert len(seen) == 4
        counter = default_counter()
        for sent in seen:
            messages = from_pydantic_ai(sent)
            check_pairing(messages, allow_pending=False)
            assert counter.count_messages(messages) <= WINDOW
        kept = from_pydantic_ai(result.all_messages())
        assert len(kept) < len(from_pydantic_ai(history))
        assert any("summary" in (m.metadata.get("tinyctx") or {}) for m in kept)
        guard = next(layer for layer in capability.stack.layers if isinstance(layer, BudgetGuard))
        stats = guard.stats(capability.stack.context("c1"))
        assert stats.calibration_ratio != 1.0 or stats.last_input_tokens > 0

    async def test_test_model_runs_through_the_stack(self, anyio_backend: str) -> None:
        """pydantic-ai's TestModel (which calls every tool) runs with the stack in place,
        and the tool-result budget cuts the long result."""
        capability = TinyctxCapability(default_stack(), max_tokens=WINDOW)
        agent = _agent(TestModel(), capability)
        result = await agent.run("hello")
        returns = [
            p
            for m in result.all_messages()
            for p in getattr(m, "parts", [])
            if isinstance(p, ToolReturnPart)
        ]
        assert returns
        assert all(len(str(p.content)) < 12_000 for p in returns)  # too big to enter whole

    async def test_a_tool_retry_prompt_goes_through_the_stack(self, anyio_backend: str) -> None:
        """A tool's ModelRetry reaches the model through the stack as pydantic-ai made it
        (tied to its call, its retry info kept), and the corrected call succeeds."""
        from pydantic_ai import ModelRetry

        seen: list[list[ModelMessage]] = []

        def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(list(messages))
            if len(seen) < 3:
                return ModelResponse(
                    parts=[ToolCallPart("check", {"x": len(seen)}, tool_call_id=f"c{len(seen)}")]
                )
            return ModelResponse(parts=[TextPart("checked")])

        agent: Agent[None, str] = Agent(
            FunctionModel(scripted),
            capabilities=[TinyctxCapability(default_stack(), max_tokens=WINDOW)],
        )

        @agent.tool_plain
        def check(x: int) -> str:
            """Check x (it must be 2)."""
            if x != 2:
                raise ModelRetry("x must be 2")
            return "x is fine"

        result = await agent.run("check it")
        assert result.output == "checked"
        # pydantic-ai says "retry" with a tool return marked retried (its retry info kept):
        # the stack sends it on as pydantic-ai made it
        (retry,) = [
            p
            for m in seen[1]
            for p in getattr(m, "parts", [])
            if getattr(p, "tool_call_id", 0) == "c1" and not isinstance(p, ToolCallPart)
        ]
        assert (retry.tool_name, retry.content, retry.outcome) == (
            "check",
            "x must be 2",
            "retried",
        )
        assert retry.retry is not None and retry.retry.cause == "model_retry"
        assert to_pydantic_ai(from_pydantic_ai(seen[1])) == seen[1]
        check_pairing(from_pydantic_ai(result.all_messages()), allow_pending=False)

    async def test_stop_with_final_answers_with_its_text(self, anyio_backend: str) -> None:
        """A layer's StopWithFinal becomes the run's text output."""

        async def stop(request: Any, ctx: Any, call_next: Any) -> Any:
            response = await call_next(request, ctx)
            ctx.request_control(StopWithFinal("stopped"))
            return response

        agent = _agent(TestModel(), TinyctxCapability([stop]))
        result = await agent.run("hello")
        assert result.output == "stopped"

    async def test_an_interrupt_raises_stack_interrupted(self, anyio_backend: str) -> None:
        """An Interrupt, which pydantic-ai has no pause for, raises naming the node."""
        from tinyctx import Interrupt

        async def pause(request: Any, ctx: Any, call_next: Any) -> Any:
            ctx.request_control(Interrupt("review", "look first"))
            return await call_next(request, ctx)

        agent = _agent(TestModel(), TinyctxCapability([pause]))
        with pytest.raises(StackInterrupted, match="review"):
            await agent.run("hello")

    async def test_history_processor_relieves_the_history(
        self, shared_data: Path, anyio_backend: str
    ) -> None:
        """The history-processor variant sends a relieved history that fits the window."""
        seen: list[list[ModelMessage]] = []
        agent: Agent[None, str] = Agent(
            _scripted(seen, 0),
            capabilities=[ProcessHistory(history_processor(default_stack(), max_tokens=WINDOW))],
        )
        await agent.run("go on", message_history=_transcript(shared_data))
        messages = from_pydantic_ai(seen[0])
        check_pairing(messages, allow_pending=False)
        assert default_counter().count_messages(messages) <= WINDOW


class TestHistory:
    """pydantic-ai JSON history imports into a tinyctx thread and exports back unchanged."""

    async def test_import_then_export_round_trips(self, tmp_path: Path) -> None:
        """A run's all_messages_json() lands in the store and exports to the same history."""
        from tinyctx import SqliteStore
        from tinyctx.integrations.pydantic_ai import export_json, import_json

        result = await _agent(TestModel(), TinyctxCapability([])).run("hello")
        store = SqliteStore(tmp_path / "t.db")
        imported = await import_json(result.all_messages_json(), store, "pa")
        assert imported == from_pydantic_ai(result.all_messages())
        exported = ModelMessagesTypeAdapter.validate_json(await export_json(store, "pa"))
        assert exported == result.all_messages()
