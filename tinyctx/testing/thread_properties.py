"""The model a ThreadStore is compared with, and the cases that drive random threads and
racing writers against it; a base of
:class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .. import codec
from ..messages import Message, UserMessage
from ..threads import (
    UNCHANGED,
    Compaction,
    FencedOut,
    Lease,
    StaleThreadVersion,
    ThreadStore,
    ThreadWrite,
    Unchanged,
)
from ._store_kit import PROPERTY, StoreFactory, ThreadSuite, fresh_id, opened
from .strategies import checkpoints, histories, layer_states

__all__ = ["ThreadModel", "ThreadPropertyConformance", "thread_steps"]


class ThreadModel:
    """The ThreadStore contract for one thread, in plain Python (the oracle of the suite)."""

    def __init__(self) -> None:
        self.version = 0
        self.messages: list[str] = []
        self.checkpoint: str | None = None
        self.state: str | None = None
        self.archive: list[tuple[int, int, int, tuple[str, ...]]] = []

    def apply(self, change: ThreadWrite) -> None:
        self.version += 1
        if change.compaction is not None:
            start, end = change.compaction.start, change.compaction.end
            if end > start:
                self.archive.append((self.version, start, end, tuple(self.messages[start:end])))
            self.messages[start:end] = change.compaction.replacement
        self.messages.extend(change.append)
        if not isinstance(change.checkpoint, Unchanged):
            self.checkpoint = change.checkpoint
        if not isinstance(change.state, Unchanged):
            self.state = change.state


async def assert_matches(store: ThreadStore, thread_id: str, model: ThreadModel) -> None:
    """Everything ``store`` reports of ``thread_id`` equals ``model``."""
    record = await store.load_thread(thread_id)
    assert record.thread_id == thread_id
    assert record.version == model.version
    assert record.messages == tuple(model.messages)
    assert record.checkpoint == model.checkpoint
    assert record.state == model.state
    archived = await store.archived(thread_id)
    assert [(a.version, a.start, a.end, a.messages) for a in archived] == model.archive
    assert all(a.thread_id == thread_id for a in archived)


# one drawn step of a thread's life: ("write", ThreadWrite) | ("stale", ThreadWrite, offset)
Step = tuple[Any, ...]

_MESSAGE_DOCS = histories(max_turns=4).map(codec.encode_messages)
_CHECKPOINT_DOCS = st.one_of(
    st.just(UNCHANGED), st.none(), checkpoints().map(codec.encode_checkpoint)
)
_STATE_DOCS = st.one_of(st.just(UNCHANGED), layer_states().map(codec.encode_state))


@st.composite
def thread_steps(draw: st.DrawFn) -> list[Step]:
    """A thread's life: writes (append, compaction, checkpoint, state) and refused ones."""
    steps: list[Step] = []
    length = 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["write", "write", "write", "stale", "out_of_range"]))
        compaction = None
        if kind == "out_of_range":
            start = draw(st.integers(0, length))
            compaction = Compaction(start, length + draw(st.integers(1, 3)), ())
        elif length and draw(st.booleans()):
            start = draw(st.integers(0, length))
            end = draw(st.integers(start, length))
            compaction = Compaction(start, end, draw(_MESSAGE_DOCS))
        append = draw(_MESSAGE_DOCS)
        change = ThreadWrite(
            append=append,
            compaction=compaction,
            checkpoint=draw(_CHECKPOINT_DOCS),
            state=draw(_STATE_DOCS),
        )
        if kind == "write":
            if compaction is not None:
                length += len(compaction.replacement) - (compaction.end - compaction.start)
            length += len(append)
            steps.append(("write", change))
        elif kind == "stale":
            steps.append(("stale", change, draw(st.sampled_from([-1, 1, 2]))))
        else:
            steps.append(("out_of_range", change))
    return steps


@pytest.mark.anyio
class ThreadPropertyConformance(ThreadSuite):
    """Racing writers and random threads: the store always equals the model."""

    # -- concurrency ---------------------------------------------------------------------

    async def test_concurrent_writers_one_winner_per_version(
        self, make_store: StoreFactory
    ) -> None:
        """Writers racing on one thread (two store objects): exactly one wins each version,
        and the log is exactly the winners' appends in version order."""
        thread = fresh_id()
        async with opened(make_store) as store:
            peer = await self.open_peer(store)
            try:
                wins: dict[int, str] = {}
                refused = 0

                async def writer(name: str, via: Any) -> None:
                    nonlocal refused
                    for step in range(15):
                        record = await via.load_thread(thread)
                        doc = codec.encode_message(UserMessage(f"{name}:{step}"))
                        try:
                            version = await via.write(
                                thread, ThreadWrite((doc,)), expected_version=record.version
                            )
                        except StaleThreadVersion:
                            refused += 1
                            continue
                        assert version not in wins
                        wins[version] = doc

                async with anyio.create_task_group() as group:
                    for index in range(4):
                        group.start_soon(writer, f"w{index}", (store, peer)[index % 2])
                record = await store.load_thread(thread)
                assert record.version == len(wins)
                assert record.messages == tuple(wins[v] for v in sorted(wins))
            finally:
                await self.close_peer(store, peer)

    async def test_delete_under_load_leaves_a_consistent_thread(
        self, make_store: StoreFactory
    ) -> None:
        """Writers keep appending while the thread is deleted: afterwards the thread holds
        exactly the writes made after the delete, once each, and nothing before it."""
        thread = fresh_id()
        async with opened(make_store) as store:
            peer = await self.open_peer(store)
            try:
                deleted = anyio.Event()
                after_delete: list[str] = []

                async def writer(name: str) -> None:
                    for step in range(20):
                        record = await store.load_thread(thread)
                        doc = codec.encode_message(UserMessage(f"{name}:{step}"))
                        seen_delete = deleted.is_set()
                        try:
                            await store.write(
                                thread, ThreadWrite((doc,)), expected_version=record.version
                            )
                        except StaleThreadVersion:
                            continue
                        if seen_delete:
                            after_delete.append(doc)

                async def deleter() -> None:
                    await anyio.sleep(0.01)
                    assert await peer.delete_thread(thread) in (True, False)
                    deleted.set()

                async with anyio.create_task_group() as group:
                    for index in range(3):
                        group.start_soon(writer, f"w{index}")
                    group.start_soon(deleter)
                record = await store.load_thread(thread)
                assert record.version == len(record.messages)
                assert len(set(record.messages)) == len(record.messages)
                assert set(after_delete) <= set(record.messages)
            finally:
                await self.close_peer(store, peer)

    # -- properties ----------------------------------------------------------------------

    @PROPERTY
    @given(steps=thread_steps())
    async def test_any_thread_reloads_as_the_model(
        self, make_store: StoreFactory, steps: list[Step]
    ) -> None:
        """Any sequence of writes (messages, compactions, checkpoints, layer state), stale
        writes and out-of-range compactions leaves the store equal to the model after every
        step; refused writes change nothing; every document decodes to what was encoded."""
        thread = fresh_id()
        model = ThreadModel()
        async with opened(make_store) as store:
            for step in steps:
                kind, change = step[0], step[1]
                if kind == "write":
                    version = await store.write(thread, change, expected_version=model.version)
                    model.apply(change)
                    assert version == model.version
                elif kind == "stale":
                    wrong = max(0, model.version + step[2])
                    if wrong == model.version:
                        wrong += 1
                    with pytest.raises(StaleThreadVersion):
                        await store.write(thread, change, expected_version=wrong)
                else:
                    with pytest.raises(ValueError, match="outside the live log"):
                        await store.write(thread, change, expected_version=model.version)
                await assert_matches(store, thread, model)
            record = await store.load_thread(thread)
            decoded: tuple[Message, ...] = codec.decode_messages(record.messages)
            assert codec.encode_messages(decoded) == record.messages
            if record.checkpoint is not None:
                assert codec.encode_checkpoint(codec.decode_checkpoint(record.checkpoint)) == (
                    record.checkpoint
                )
            if record.state is not None:
                assert codec.encode_state(codec.decode_state(record.state)) == record.state

    @PROPERTY
    @given(steps=thread_steps(), data=st.data())
    async def test_a_fenced_out_write_never_lands(
        self, make_store: StoreFactory, steps: list[Step], data: st.DataObject
    ) -> None:
        """Whatever a fenced-out writer sends, the thread stays exactly as it was."""
        thread = fresh_id()
        model = ThreadModel()
        async with opened(make_store) as store:
            old = await store.acquire_lease(thread, "old", 60)
            for step in steps:
                if step[0] == "write":
                    await store.write(thread, step[1], expected_version=model.version, lease=old)
                    model.apply(step[1])
            current: Lease = await store.acquire_lease(thread, "old", 60)
            late = data.draw(st.sampled_from(steps))[1]
            with pytest.raises(FencedOut):
                await store.write(thread, late, expected_version=model.version, lease=old)
            await assert_matches(store, thread, model)
            assert (await store.load_thread(thread)).lease == current
