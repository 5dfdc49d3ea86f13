"""Usage totals stored with the thread: per run and in total, read without the messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tinyctx import (
    Agent,
    Approve,
    AssistantMessage,
    Interrupted,
    ModelResponse,
    Session,
    Usage,
    tool,
)
from tinyctx.codec import encode_state
from tinyctx.engines import run_write, write_payload
from tinyctx.forks import fork_thread
from tinyctx.middleware import Approvals
from tinyctx.stores import MemoryStore, SqliteStore
from tinyctx.testing import ScriptedModel, call
from tinyctx.thread_usage import RUNS_KEPT, ThreadUsage, thread_usage
from tinyctx.threads import ThreadRecord, ThreadWrite
from tinyctx.usage import Price


def _answer(text: str, used: Usage, *calls: Any) -> ModelResponse:
    return ModelResponse(AssistantMessage(text, calls), usage=used, model="m")


@tool
async def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


class _CountingLoads(MemoryStore):
    """A MemoryStore that counts whole-thread loads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        self.loads += 1
        return await super().load_thread(thread_id)


class TestUsageWithTheThread:
    """Each run adds its tokens and cost; the record reads back without messages."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    async def test_runs_and_total_are_stored(self, kind: str, tmp_path: Path) -> None:
        """Two runs in two sessions: the total is their sum, each run is listed."""
        store: Any = _CountingLoads() if kind == "memory" else SqliteStore(tmp_path / "u.db")
        model = ScriptedModel([_answer("one", Usage(100, 10)), _answer("two", Usage(200, 20, 50))])
        agent = Agent(model=model)
        prices = {"m": Price(input=1.0, output=2.0)}
        run_ids = []
        for text in ("a", "b"):
            async with Session(agent, thread_id="t", store=store, prices=prices) as session:
                run_ids.append((await session.run(text)).run_id)
        if kind == "memory":
            store.loads = 0
        record = await thread_usage(store, "t")
        if kind == "memory":
            assert store.loads == 0  # read through load_window(count=0)
        assert record.total.usage == Usage(300, 30, 50)
        assert record.total.calls == 2
        assert record.total.cost == pytest.approx((300 * 1.0 + 30 * 2.0) / 1_000_000)
        assert [r.run_id for r in record.runs] == run_ids
        first = record.run(run_ids[0])
        assert first is not None
        assert first.usage == Usage(100, 10)
        await store.aclose()

    async def test_a_paused_run_is_one_run_across_its_resume(self) -> None:
        """The part before the pause and the part after it add to the same run."""
        store = MemoryStore()
        model = ScriptedModel(
            [
                _answer("", Usage(50, 5), call("deploy", id="d1", service="web")),
                _answer("done", Usage(70, 7)),
            ]
        )
        agent = Agent(model=model, tools=[deploy], middleware=[Approvals("deploy")])
        async with Session(agent, thread_id="p", store=store) as session:
            with pytest.raises(Interrupted):
                await session.run("ship")
        paused = await thread_usage(store, "p")
        assert paused.total.usage == Usage(50, 5)
        async with Session(agent, thread_id="p", store=store) as session:
            result = await session.resume(decisions={"d1": Approve()})
        record = await thread_usage(store, "p")
        assert record.total.usage == Usage(120, 12)
        (run,) = record.runs
        assert run.run_id == result.run_id
        assert run.calls == 2

    async def test_an_unknown_thread_has_an_empty_record(self) -> None:
        """No runs, nothing used."""
        record = await thread_usage(MemoryStore(), "nobody")
        assert record.runs == []
        assert record.total.usage == Usage()

    async def test_a_corrupt_record_never_stops_a_run(self) -> None:
        """A record edited into garbage is started again; the run goes on."""
        store = MemoryStore()
        doc = '{"tinyctx.usage":{"total":{"calls":-4}}}'
        await store.write("c", ThreadWrite(state=_state(doc)), expected_version=0)
        agent = Agent(model=ScriptedModel([_answer("ok", Usage(1, 1))]))
        async with Session(agent, thread_id="c", store=store) as session:
            assert (await session.run("hi")).final_text == "ok"
        assert (await thread_usage(store, "c")).total.usage == Usage(1, 1)

    def test_the_record_keeps_the_newest_runs(self) -> None:
        """Past RUNS_KEPT runs the oldest leave the list; the total keeps counting."""
        record = ThreadUsage()
        for index in range(RUNS_KEPT + 5):
            record.add(f"r{index}", Usage(1, 0), 1, 0.0)
        assert len(record.runs) == RUNS_KEPT
        assert record.runs[0].run_id == "r5"
        assert record.total.calls == RUNS_KEPT + 5
        again = ThreadUsage.from_json(record.to_json())
        assert again.to_json() == record.to_json()


def _state(inner: str) -> str:
    """A thread state document holding ``inner`` (a JSON object of layer states)."""
    return encode_state(json.loads(inner))


class TestVersionsNameTheirRun:
    """Each version a session writes names the run that wrote it, as its usage does."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    async def test_the_version_list_says_which_run_wrote_each(
        self, kind: str, tmp_path: Path
    ) -> None:
        """Two runs with a tool step each: every version is recorded under the id its
        run's usage is (a write outside a run, a fork, names none)."""
        store: Any = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "v.db")
        model = ScriptedModel(
            [
                _answer("", Usage(1, 1), call("deploy", id="d1", service="web")),
                _answer("one", Usage(1, 1)),
                _answer("", Usage(1, 1), call("deploy", id="d2", service="db")),
                _answer("two", Usage(1, 1)),
            ]
        )
        agent = Agent(model=model, tools=[deploy])
        run_ids = []
        for text in ("a", "b"):
            async with Session(agent, thread_id="t", store=store) as session:
                run_ids.append((await session.run(text)).run_id)
        versions = await store.versions("t")
        by_run = {v.run_id for v in versions}
        assert by_run == set(run_ids)
        assert [r.run_id for r in (await thread_usage(store, "t")).runs] == run_ids
        assert versions[0].run_id == run_ids[0] and versions[-1].run_id == run_ids[1]
        await fork_thread(store, "t", new_id="t-fork")
        assert [v.run_id for v in await store.versions("t-fork")] == [None]
        await store.aclose()

    async def test_an_engine_write_step_keeps_the_run_id(self) -> None:
        """A write an engine replays from its JSON payload is recorded under the same run
        (a payload recorded before run ids were carried writes with none)."""
        store = MemoryStore()
        change = ThreadWrite(("a",), run_id="run-7")
        payload = json.loads(json.dumps(write_payload("t", change, 0, None)))
        await run_write(store, payload)
        older = dict(write_payload("t", ThreadWrite(("b",)), 1, None))
        older.pop("run_id")
        await run_write(store, older)
        assert [v.run_id for v in await store.versions("t")] == ["run-7", None]
