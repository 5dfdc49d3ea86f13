"""A durable step writes only what it added, and the store holds what memory holds.

The step's write is built without copying the history (a sync point instead of a
snapshot, the layer state encoded from what changed): these tests hold the invariants
that rely on, on a real SQLite file and in memory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_durable_session import SpyStore
from tinyctx import Agent, Message, Session, ToolResult
from tinyctx.codec import CodecError, StateEncoder, decode_messages, encode_state
from tinyctx.frozen import FrozenDict
from tinyctx.middleware import BudgetGuard, CallLimits
from tinyctx.stores import SqliteStore
from tinyctx.testing import FakeTool, ScriptedModel, call, reply
from tinyctx.thread_usage import RUNS_KEPT

# what a step does: a plain answer, an answer after one tool call, or a compaction of the
# history (a message rewritten) before the run
steps = st.lists(st.sampled_from(["answer", "tool", "compact"]), min_size=1, max_size=12)


def _script(plan: list[str]) -> list[Any]:
    script: list[Any] = []
    for step in plan:
        if step == "tool":
            script += [reply("", call("look")), "seen"]
        else:
            script.append("done")
    return script


async def _drive(session: Session[Any], plan: list[str]) -> None:
    for index, step in enumerate(plan):
        if step == "compact":
            conversation = session.ctx.conversation
            kept = list(conversation.messages)
            target = next(
                (i for i, m in enumerate(kept) if not isinstance(m, ToolResult) and i % 2), None
            )
            if target is not None:
                kept[target] = kept[target].evolve(metadata={"compacted": index})
                conversation.replace(kept, emit_new=False)
        await session.run(f"step {index}")


def _agent(plan: list[str]) -> Agent:
    return Agent(
        model=ScriptedModel(_script(plan)),
        tools=[FakeTool("look").tool],
        middleware=[CallLimits(model_calls=1000, scope="thread"), BudgetGuard(max_tokens=100_000)],
    )


class TestStoredStepReadsBack:
    """After any steps, the stored thread and state equal the session's in memory."""

    @settings(max_examples=8, deadline=None)
    @given(plan=steps)
    async def test_sqlite_thread_equals_memory(self, plan: list[str]) -> None:
        """Messages and layer state read back from the SQLite file equal memory's."""
        with tempfile.TemporaryDirectory() as folder:
            async with SqliteStore(Path(folder) / "t.db") as store:
                async with Session(_agent(plan), thread_id="t", store=store) as session:
                    await _drive(session, plan)
                    expected: tuple[Message, ...] = session.conversation_messages
                    state = session.ctx.conversation.layer_state.dump()
                record = await store.load_thread("t")
                assert decode_messages(record.messages) == expected
                assert record.state == encode_state(state)  # the same bytes

    @settings(max_examples=6, deadline=None)
    @given(plan=steps)
    async def test_a_step_appends_only_its_messages(self, plan: list[str]) -> None:
        """A step without a compaction writes its own messages and no range, however long
        the thread."""
        store = SpyStore()
        async with Session(_agent(plan), thread_id="t", store=store) as session:
            for index, step in enumerate(plan):
                before = len(session.ctx.conversation)
                store.writes.clear()
                await _drive(session, [step if step != "compact" else "answer"])
                added = len(session.ctx.conversation) - before
                assert all(w.compaction is None for w in store.writes), index
                assert sum(len(w.append) for w in store.writes) == added
                assert added == (4 if step == "tool" else 2)
                record = await store.load_thread("t")
                assert decode_messages(record.messages) == session.conversation_messages


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.dictionaries(st.text(max_size=5), inner, max_size=4).map(FrozenDict),
    ),
    max_leaves=12,
)
states = st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=4)


class TestStateEncoder:
    """Encoding state from the last write's parts gives encode_state's bytes."""

    @settings(max_examples=30, deadline=None)
    @given(sequence=st.lists(states, min_size=1, max_size=4), reuse=st.booleans())
    def test_same_bytes_as_encode_state(self, sequence: list[dict[str, Any]], reuse: bool) -> None:
        """Every document of a sequence, frozen parts reused or not, equals encode_state's;
        a state the codec refuses is refused with the same error."""
        encoder = StateEncoder()
        previous: dict[str, Any] = {}
        for state in sequence:
            if reuse:  # the frozen parts of the last state carried over, the same objects
                state = {**{k: v for k, v in previous.items() if type(v) is FrozenDict}, **state}
            refused: str | None = None
            try:
                expected = encode_state(state)
            except CodecError as exc:
                refused = str(exc)
            if refused is not None:
                with pytest.raises(CodecError) as again:
                    encoder.encode(state)
                assert str(again.value) == refused
                continue
            assert encoder.encode(state) == expected
            previous = state

    def test_types_are_kept_apart(self) -> None:
        """1, 1.0, True and 0.0/-0.0 stay themselves when a frozen part is reused."""
        encoder = StateEncoder()
        part: FrozenDict[str, Any] = FrozenDict(a=1, b=0.0)
        for state in ({"x": part, "y": 1}, {"x": part, "y": True}, {"x": part, "y": -0.0}):
            assert encoder.encode(state) == encode_state(state)

    def test_a_long_usage_record_reencodes_only_the_new_run(self) -> None:
        """The usage record's kept runs are the same frozen entries from write to write."""
        from tinyctx.model import Usage
        from tinyctx.thread_usage import ThreadUsage

        record = ThreadUsage()
        for n in range(RUNS_KEPT + 5):
            record.add(f"run-{n}", Usage(10, 2), 1, 0.0)
        first = record.to_json()
        record.add("run-new", Usage(1, 1), 1, 0.0)
        second = record.to_json()
        assert all(a is b for a, b in zip(first["runs"][1:], second["runs"][:-1], strict=True))
        encoder = StateEncoder()
        for value in (first, second):
            assert encoder.encode({"tinyctx.usage": value}) == encode_state(
                {"tinyctx.usage": value}
            )
