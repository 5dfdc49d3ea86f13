"""A paused run on a stored thread: the stored checkpoint is the authority on a resume, and
the run's usage is the same wherever it resumes (every store, trio and asyncio)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.servers import make_backend
from tinyctx import (
    Agent,
    Interrupt,
    Interrupted,
    Layer,
    LimitExceeded,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ResumeError,
    RunConfig,
    RunContext,
    Session,
    SqliteStore,
    Usage,
)
from tinyctx.agent import Checkpoint
from tinyctx.codec import decode_checkpoint, decode_messages, encode_checkpoint
from tinyctx.errors import InvalidCheckpoint
from tinyctx.middleware import (
    BudgetGuard,
    CallLimits,
    ExtractiveSummarizer,
    Fallback,
    Microcompact,
    Summarize,
)
from tinyctx.testing import FakeTool, call, reply

STORES = ["memory", "sqlite", "postgres", "redis"]
CRASH_WORKER = Path(__file__).with_name("compaction_crash_worker.py")


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

    async def test_a_value_edited_to_another_json_type_is_caught(self, store: Any) -> None:
        """A counter edited from 1 to true (equal in Python) is a different stored document."""
        model, deploy = script(), FakeTool("deploy", returns="ok")
        checkpoint = await pause(store, model, deploy)
        state = {
            name: {**value, "model": True} if value.get("model") == 1 else value
            for name, value in checkpoint.state.items()
        }
        forged = checkpoint.evolve(state=state)
        assert forged == checkpoint  # equal as Python values: only the documents differ
        async with Session(agent_for(model, deploy), thread_id="t", store=store) as session:
            with pytest.raises(ResumeError, match="the stored document"):
                await session.resume(forged)
        assert deploy.calls == [] and len(model.seen) == 1

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


def compacting(kind: str) -> Layer:
    """A persistent compaction layer that rewrites a history of a few tool results."""
    if kind == "summarize":
        return Summarize(ExtractiveSummarizer(), trigger_tokens=200, keep_recent=2)
    if kind == "microcompact":
        return Microcompact(keep_recent=1)
    assert kind == "budget"
    return BudgetGuard(max_tokens=600, low_water=0.3)


class StoreWatcher:
    """A model that, at every call, reads the thread from the store as a new process would
    and records whether it holds exactly the request's history; it fails on call ``fail_at``
    (a provider error after the layers committed their rewrite)."""

    def __init__(self, store: Any, thread: str, fail_at: int) -> None:
        self.store, self.thread, self.fail_at = store, thread, fail_at
        self.stored_as_seen: list[bool] = []

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        record = await self.store.load_thread(self.thread)
        self.stored_as_seen.append(decode_messages(record.messages) == request.messages)
        number = len(self.stored_as_seen)
        if number == self.fail_at:
            raise RuntimeError("the provider went away")
        return reply("", call("read", id=f"r{number}"))


class TestCompactionsAreDurableBeforeTheModelCall:
    """A persistent rewrite (Summarize, Microcompact, the budget guard's reliefs) is in the
    store before the model call that sees it, so a crash in that call loses nothing the
    model saw."""

    @pytest.mark.parametrize("kind", ["summarize", "microcompact", "budget"])
    async def test_the_store_holds_what_each_model_call_sees(self, store: Any, kind: str) -> None:
        """At every call, the compacted ones included, the stored thread is the request's
        history; the call that fails after a compaction finds it stored already."""
        model = StoreWatcher(store, "c", fail_at=6)
        agent = Agent(
            model=model,
            tools=[FakeTool("read", returns="line of output " * 30).tool],
            middleware=[compacting(kind)],
        )
        config = RunConfig(thread_id="c", max_model_calls=10)
        async with Session(agent, config=config, store=store) as session:
            with pytest.raises(RuntimeError, match="provider went away"):
                await session.run("read a lot")
        assert await store.archived("c"), f"{kind} compacted nothing: the test shows nothing"
        assert model.stored_as_seen == [True] * 6

    async def test_an_alternative_models_call_sees_a_durable_history(self, store: Any) -> None:
        """Fallback's alternative models are called past the onion's core: when the
        primary path fails before reaching it (a layer inside Fallback refused), the store
        holds the compacted history before an alternative runs too."""
        watcher = StoreWatcher(store, "f", fail_at=0)

        async def refuse(
            request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
        ) -> ModelResponse:
            raise ConnectionError("primary region down")

        agent = Agent(
            model=StoreWatcher(store, "f", fail_at=1),  # never reached
            tools=[FakeTool("read", returns="line of output " * 30).tool],
            middleware=[Microcompact(keep_recent=1), Fallback(watcher), refuse],
        )
        config = RunConfig(thread_id="f", max_model_calls=5)
        async with Session(agent, config=config, store=store) as session:
            with pytest.raises(LimitExceeded):
                await session.run("read a lot")
        assert await store.archived("f")
        assert watcher.stored_as_seen == [True] * 5


class TestACrashRightAfterACompaction:
    """A worker SIGKILLed inside the model call that first saw a persisted compaction
    leaves a stored thread equal to what that call saw (a real process, real SQLite)."""

    @pytest.mark.parametrize("kind", ["summarize", "microcompact", "budget"])
    @pytest.mark.parametrize("backend", ["trio", "asyncio"])
    def test_the_stored_thread_is_what_the_killed_call_saw(
        self, tmp_path: Path, kind: str, backend: str
    ) -> None:
        """The worker is killed in its sixth model call; the file holds that call's history."""
        db, seen = tmp_path / "threads.db", tmp_path / "seen.json"
        done = subprocess.run(
            [sys.executable, str(CRASH_WORKER), str(db), str(seen), kind, backend],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr
        saw = decode_messages(json.loads(seen.read_text()))

        async def stored() -> tuple[Any, ...]:
            store = SqliteStore(db)
            try:
                assert await store.archived("c"), f"{kind} compacted nothing before the kill"
                return decode_messages((await store.load_thread("c")).messages)
            finally:
                await store.aclose()

        assert anyio.run(stored, backend=backend) == saw
