"""A paused run on a stored thread: the stored checkpoint is the authority on a resume, and
the run's usage is the same wherever it resumes (every store, trio and asyncio)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import make_backend
from tinyctx import (
    Agent,
    Checkpoint,
    Interrupt,
    Interrupted,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ResumeError,
    RunConfig,
    RunContext,
    Session,
    Usage,
)
from tinyctx.codec import decode_checkpoint, encode_checkpoint
from tinyctx.errors import InvalidCheckpoint
from tinyctx.middleware import CallLimits
from tinyctx.testing import FakeTool, call, reply

STORES = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A new, empty store of each kind (real PostgreSQL and Redis)."""
    backend = make_backend(request.param, request, tmp_path)
    yield backend
    await backend.aclose()


class Gate(Layer):
    """Pauses for approval, with a payload, whenever the model asks for ``deploy``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "deploy" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "deploy?", payload={"env": "staging"}))
        return response


class Recorder:
    """A model that answers from a script and records the config of each call it gets."""

    def __init__(self, *script: ModelResponse) -> None:
        self.script = list(script)
        self.seen: list[RunConfig] = []

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        self.seen.append(ctx.config)
        return self.script.pop(0)


def agent_for(model: Recorder, deploy: FakeTool) -> Agent:
    return Agent(
        model=model,
        tools=[deploy.tool],
        middleware=[CallLimits(model_calls=5), Gate()],
    )


def script() -> Recorder:
    return Recorder(
        reply("", call("deploy", id="d1"), usage=Usage(100, 50, 3)),
        reply("deployed", usage=Usage(1, 1)),
    )


async def pause(store: Any, model: Recorder, deploy: FakeTool) -> Checkpoint:
    """Run thread ``t`` to its approval pause in one session; the checkpoint it raised."""
    config = RunConfig(thread_id="t", user_id="alice", max_model_calls=4)
    async with Session(agent_for(model, deploy), config=config, store=store) as session:
        with pytest.raises(Interrupted) as info:
            await session.run("ship it")
    return info.value.checkpoint


def forge(checkpoint: Checkpoint, edit: str) -> Checkpoint:
    """The checkpoint with one field edited as a hostile client would."""
    if edit == "run_config":
        config = checkpoint.run_config.evolve(user_id="victim", max_model_calls=1_000_000)
        return checkpoint.evolve(run_config=config)
    if edit == "state":
        state = {name: {"model": 0, "tools": 0, "per_tool": {}} for name in checkpoint.state}
        assert state, "CallLimits keeps per-run counters in the checkpoint"
        return checkpoint.evolve(state=state)
    if edit == "node":
        return checkpoint.evolve(node="other")
    if edit == "payload":
        return checkpoint.evolve(payload={"env": "production"})
    if edit == "message":
        return checkpoint.evolve(message="approved already")
    if edit == "usage":
        return checkpoint.evolve(usage=Usage(0, 0))
    assert edit == "added"
    return checkpoint.evolve(added=checkpoint.added[:1])


class TestTheStoredCheckpointIsTheAuthority:
    """A checkpoint handed back to resume() on a stored thread must be the stored pause
    exactly: an edited copy is a ResumeError before anything runs."""

    @pytest.mark.parametrize(
        "edit", ["run_config", "state", "node", "payload", "message", "usage", "added"]
    )
    async def test_an_edited_checkpoint_is_refused_before_anything_runs(
        self, store: Any, edit: str
    ) -> None:
        """Edited run config, layer counters, node, payload, message, usage or added
        messages: refused naming the field; nothing ran; the genuine one still resumes."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        checkpoint = await pause(store, model, deploy)
        forged = forge(checkpoint, edit)
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            with pytest.raises(ResumeError, match=edit):
                await session.resume(forged)
            with pytest.raises(ResumeError, match=edit):
                await session.check_resume(forged)
            assert deploy.calls == [] and len(model.seen) == 1
            assert session.paused is not None
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            result = await session.resume(checkpoint)
        assert result.final_text == "deployed"
        assert deploy.calls == [{}]
        assert [c.user_id for c in model.seen] == ["alice", "alice"]
        assert model.seen[-1].max_model_calls == 4

    async def test_a_decoded_copy_of_the_stored_checkpoint_resumes(self, store: Any) -> None:
        """The checkpoint as a client kept it (encoded, decoded again) is the same pause."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        checkpoint = await pause(store, model, deploy)
        copy = decode_checkpoint(encode_checkpoint(checkpoint))
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            await session.check_resume(copy)
            result = await session.resume(copy)
        assert result.final_text == "deployed"
        assert deploy.calls == [{}]

    async def test_a_checkpoint_of_another_pause_is_still_invalid(self, store: Any) -> None:
        """A checkpoint that is not the stored pause at all keeps its InvalidCheckpoint."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        checkpoint = await pause(store, model, deploy)
        other = checkpoint.evolve(run_config=checkpoint.run_config.evolve(run_id="elsewhere"))
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            with pytest.raises(InvalidCheckpoint, match="paused on another run"):
                await session.resume(other)
        assert deploy.calls == []


class TestUsageAfterAResume:
    """A resumed run reports its whole usage, the pause's part included, wherever it resumes."""

    async def test_resumed_in_another_session(self, store: Any) -> None:
        """A new session (a new request, a new process) reports 101/51/3, not 1/1."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        checkpoint = await pause(store, model, deploy)
        assert checkpoint.usage == Usage(100, 50, 3)
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            result = await session.resume()
        assert result.usage == Usage(101, 51, 3)

    async def test_resumed_in_the_same_session(self, store: Any) -> None:
        """The session that paused reports the same 101/51/3."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            with pytest.raises(Interrupted):
                await session.run("ship it")
            result = await session.resume()
        assert result.usage == Usage(101, 51, 3)

    async def test_paused_twice_and_resumed_elsewhere_each_time(self, store: Any) -> None:
        """A run that pauses again after a resume carries its whole usage to the next pause."""
        model = Recorder(
            reply("", call("deploy", id="d1"), usage=Usage(100, 50, 3)),
            reply("", call("deploy", id="d2"), usage=Usage(10, 5)),
            reply("done", usage=Usage(1, 1)),
        )
        deploy = FakeTool("deploy", returns="ok")
        await pause(store, model, deploy)
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            with pytest.raises(Interrupted) as info:
                await session.resume()
        assert info.value.checkpoint.usage == Usage(110, 55, 3)
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            result = await session.resume()
        assert result.usage == Usage(111, 56, 3)
