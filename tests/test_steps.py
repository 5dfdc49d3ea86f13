"""The engine hook (tinyctx.steps): recorded outputs round-trip, digests are stable and
sensitive, the layer passes through outside an engine and replays recorded steps."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import Agent, AssistantMessage, ModelResponse, Session, ToolCall, ToolResult, tool
from tinyctx.context import new_run_id
from tinyctx.ordering import OrderingError
from tinyctx.steps import (
    EngineSteps,
    NondeterminismError,
    decode_response,
    encode_response,
    model_digest,
    model_payload,
    request_from_payload,
    run_ids_from,
    steps_through,
    with_engine_steps,
)
from tinyctx.testing import quiet_context
from tinyctx.testing.strategies import requests, responses


class _Recorder:
    """A StepRunner that records envelopes, or replays them in order."""

    layers = ("a", "b")

    def __init__(self, replay: list[dict[str, Any]] | None = None) -> None:
        self.recorded: list[tuple[str, dict[str, Any]]] = []
        self.replay = replay
        self._count = 0

    def next_index(self) -> int:
        self._count += 1
        return self._count - 1

    async def step(
        self,
        name: str,
        digest: str,
        run: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
        payload: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        if self.replay is not None:
            return self.replay.pop(0)
        envelope = await run()
        self.recorded.append((name, envelope))
        return envelope


def _agent(calls: list[str], clock: list[int] | None = None) -> Agent:
    async def model(request: Any, ctx: Any) -> ModelResponse:
        calls.append("model")
        done = sum(isinstance(m, ToolResult) for m in request.messages)
        if done < 2:
            call = ToolCall(f"c{done}", "work", {"n": done})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage("done"))

    @tool
    async def work(n: int) -> str:
        """Work."""
        calls.append(f"work{n}")
        if n == 1:
            raise ValueError("tool failed")
        return f"worked {n}"

    middleware: tuple[Any, ...] = ()
    if clock is not None:

        async def stamp(request: Any, ctx: Any, call_next: Any) -> Any:
            return await call_next(request.evolve(system_prompt=f"t={clock[0]}"), ctx)

        middleware = (stamp,)
    return Agent(model, tools=[work], middleware=middleware)


class TestEncodings:
    """What a step records reads back as the value it recorded."""

    @given(responses())
    def test_response_round_trip(self, response: ModelResponse) -> None:
        """decode_response(encode_response(r)) equals r (raw and info are not kept)."""
        decoded = decode_response(encode_response(response))
        assert decoded.message == response.message
        assert decoded.usage == response.usage
        assert decoded.control == response.control
        assert decoded.model == response.model

    @given(requests())
    def test_digest_is_stable_and_survives_the_payload(self, request: Any) -> None:
        """A request's digest is the same computed twice and after its JSON payload."""
        assert model_digest(request) == model_digest(request)
        rebuilt = request_from_payload(model_payload(request, quiet_context()))
        assert rebuilt.messages == request.messages
        assert model_digest(rebuilt.evolve(server_tools=request.server_tools)) == model_digest(
            request
        )

    @given(requests(), st.text(min_size=1, max_size=20))
    def test_digest_sees_a_changed_prompt(self, request: Any, extra: str) -> None:
        """A different system prompt gives a different digest."""
        changed = request.evolve(system_prompt=(request.system_prompt or "") + extra)
        assert model_digest(changed) != model_digest(request)


class TestLayer:
    """EngineSteps is the innermost layer; a pass-through without a runner."""

    def test_innermost(self) -> None:
        """A model layer placed inside EngineSteps breaks its ordering rule."""

        async def inner(request: Any, ctx: Any, call_next: Any) -> Any:
            return await call_next(request, ctx)

        with pytest.raises(OrderingError):
            Agent(_agent([]).model, middleware=(EngineSteps(), inner))

    def test_with_engine_steps_is_idempotent(self) -> None:
        """Adding the hook twice adds it once."""
        agent = with_engine_steps(with_engine_steps(_agent([])))
        assert sum(isinstance(m, EngineSteps) for m in agent.middleware) == 1

    async def test_pass_through_without_runner(self) -> None:
        """Outside an engine the run is the same as without the layer."""
        plain, hooked = [], []
        a = await _agent(plain).run("go")
        b = await with_engine_steps(_agent(hooked)).run("go")
        assert plain == hooked
        assert [m.content for m in a.messages] == [m.content for m in b.messages]

    async def test_replay_hands_back_recorded_outputs(self) -> None:
        """Replayed steps run nothing: same messages, tool error still an error result."""
        calls: list[str] = []
        recorder = _Recorder()
        agent = with_engine_steps(_agent(calls))
        with steps_through(recorder):
            first = await agent.run("go")
        assert [name for name, _ in recorder.recorded] == [
            "tinyctx.model",
            "tinyctx.tool:work",
            "tinyctx.model",
            "tinyctx.tool:work",
            "tinyctx.model",
        ]
        ran = list(calls)
        replayer = _Recorder([envelope for _, envelope in recorder.recorded])
        with steps_through(replayer):
            again = await agent.run("go")
        assert calls == ran  # nothing ran again
        assert [m.content for m in again.messages] == [m.content for m in first.messages]
        errors = [m for m in again.messages if isinstance(m, ToolResult) and m.is_error]
        assert len(errors) == 1 and "tool failed" in errors[0].content

    async def test_changed_request_is_refused_on_replay(self) -> None:
        """A layer whose request changes between runs raises NondeterminismError."""
        clock = [1]
        recorder = _Recorder()
        agent = with_engine_steps(_agent([], clock))
        with steps_through(recorder):
            await agent.run("go")
        clock[0] = 2
        with (
            steps_through(_Recorder([e for _, e in recorder.recorded])),
            pytest.raises(NondeterminismError) as refused,
        ):
            await agent.run("go")
        assert refused.value.step == "tinyctx.model"
        assert refused.value.index == 0
        assert "a -> b" in str(refused.value)


class TestRunIds:
    """Run ids in a workflow come from its id; outside, they are random."""

    def test_deterministic_inside(self) -> None:
        """The same seed gives the same sequence of ids."""
        with run_ids_from("wf"):
            first = [new_run_id() for _ in range(3)]
        with run_ids_from("wf"):
            again = [new_run_id() for _ in range(3)]
        assert first == again and len(set(first)) == 3
        assert new_run_id() != new_run_id()

    async def test_session_run_ids(self) -> None:
        """A session's run in a seeded context gets a seeded id."""
        with run_ids_from("wf-x"):
            async with Session(_agent([])) as session:
                a = await session.run("go")
        with run_ids_from("wf-x"):
            async with Session(_agent([])) as session:
                b = await session.run("go")
        assert a.run_id == b.run_id
