"""Conformance cases for the optional thread-lifecycle protocols (:mod:`tinyctx.lifecycle`).

:class:`ThreadLifecycleConformance` is a base of
:class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`, so every backend
suite runs it; a case whose protocol the store under test does not implement is skipped
(a third-party store without the capability still passes the rest).
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .. import codec
from ..forks import ThreadExists, fork_thread, rewind, rewind_to_version
from ..history import load_thread
from ..lifecycle import ArchivePruneStore, ThreadWindowStore
from ..messages import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from ..model import Usage
from ..store_protocols import Store
from ..thread_usage import USAGE_KEY, ThreadUsage, thread_usage
from ..threads import Compaction, ThreadWrite
from ..versions import ThreadVersionStore, VersionUnavailable, load_as_of
from ._store_kit import PROPERTY, StoreFactory, opened
from ._store_kit import fresh_id as _fresh_id

__all__ = ["ThreadLifecycleConformance"]


def _fresh(prefix: str = "lc") -> str:
    return _fresh_id(prefix)


def _require(store: Any, protocol: type) -> None:
    if not isinstance(store, protocol):
        pytest.skip(f"{type(store).__name__} does not implement {protocol.__name__}")


def _users(*texts: str) -> tuple[str, ...]:
    return codec.encode_messages(UserMessage(text) for text in texts)


def _turn(index: int, calls: int) -> list[Message]:
    """A user message, then an assistant with ``calls`` tool calls and their results."""
    turn: list[Message] = [UserMessage(f"u{index}")]
    if calls == 0:
        turn.append(AssistantMessage(f"a{index}"))
        return turn
    tool_calls = tuple(ToolCall(f"c{index}-{k}", "tool", {"k": k}) for k in range(calls))
    turn.append(AssistantMessage("", tool_calls))
    turn.extend(ToolResult.for_call(call, f"r{call.id}") for call in tool_calls)
    return turn


def _history(shape: list[int]) -> list[Message]:
    return [m for index, calls in enumerate(shape) for m in _turn(index, calls)]


def _pair_complete(messages: tuple[Message, ...]) -> bool:
    called = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
    return all(m.tool_call_id in called for m in messages if isinstance(m, ToolResult))


@pytest.mark.anyio
class ThreadLifecycleConformance:
    """Thread lifecycle on every store: windows and pages, usage, fork and rewind."""

    # -- windows and pages ---------------------------------------------------------------

    async def test_a_window_is_a_slice_of_the_live_log(self, make_store: StoreFactory) -> None:
        """load_window returns the newest count messages before stop, with version and
        length; count=0 reads the state without messages; an unknown thread is empty."""
        thread = _fresh()
        async with opened(make_store) as store:
            _require(store, ThreadWindowStore)
            empty = await store.load_window(thread, count=5)
            assert (empty.version, empty.length, empty.start, empty.messages) == (0, 0, 0, ())
            docs = _users(*(f"m{i}" for i in range(10)))
            await store.write(
                thread, ThreadWrite(docs, state="s", checkpoint="cp"), expected_version=0
            )
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, _users("sum"))), expected_version=1
            )
            live = (*_users("sum"), *docs[2:])
            newest = await store.load_window(thread, count=3)
            assert (newest.version, newest.length, newest.start) == (2, 9, 6)
            assert newest.messages == live[6:]
            assert (newest.checkpoint, newest.state) == ("cp", "s")
            middle = await store.load_window(thread, stop=4, count=3)
            assert (middle.start, middle.messages) == (1, live[1:4])
            head = await store.load_window(thread, stop=2, count=10)
            assert (head.start, head.messages) == (0, live[:2])
            past = await store.load_window(thread, stop=100, count=2)
            assert (past.start, past.messages) == (7, live[7:])
            bare = await store.load_window(thread, count=0)
            assert (bare.length, bare.start, bare.messages, bare.state) == (9, 9, (), "s")

    async def test_window_arguments_are_checked(self, make_store: StoreFactory) -> None:
        """A negative count or stop is a ValueError naming the argument."""
        async with opened(make_store) as store:
            _require(store, ThreadWindowStore)
            with pytest.raises(ValueError, match="count"):
                await store.load_window(_fresh(), count=-1)
            with pytest.raises(ValueError, match="stop"):
                await store.load_window(_fresh(), stop=-2, count=1)

    async def test_the_newest_page_reaches_back_to_the_call(self, make_store: StoreFactory) -> None:
        """A limit that cuts into a tool turn's results brings the assistant call along."""
        thread = _fresh()
        history = _history([0, 3])  # u0 a0 u1 A(c0,c1,c2) r r r
        async with opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(codec.encode_messages(history)), expected_version=0
            )
            page = await load_thread(store, thread, limit=2)
            assert page.start == 3
            assert page.messages == tuple(history[3:])
            assert page.before == 3
            assert page.length == 7
            assert page.version == 1
            older = await load_thread(store, thread, limit=10, before=page.before)
            assert older.messages == tuple(history[:3])
            assert older.before is None
            whole = await load_thread(store, thread)
            assert whole.messages == tuple(history)
            assert whole.start == 0

    async def test_page_arguments_are_checked(self, make_store: StoreFactory) -> None:
        """limit below 1 and a negative before are ValueErrors naming the argument."""
        async with opened(make_store) as store:
            with pytest.raises(ValueError, match="limit"):
                await load_thread(store, _fresh(), limit=0)
            with pytest.raises(ValueError, match="before"):
                await load_thread(store, _fresh(), before=-1)

    async def test_usage_totals_read_back_without_messages(self, make_store: StoreFactory) -> None:
        """A thread's stored usage record reads back as written (thread_usage)."""
        thread = _fresh()
        record = ThreadUsage()
        record.add("run-1", Usage(120, 30, 10), 2, 0.5)
        state = codec.encode_state({USAGE_KEY: record.to_json()})
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(_users("hi"), state=state), expected_version=0)
            read = await thread_usage(store, thread)
            assert read.to_json() == record.to_json()
            assert (await thread_usage(store, _fresh())).runs == []

    # -- fork and rewind -----------------------------------------------------------------

    async def test_a_fork_copies_and_never_shares(self, make_store: StoreFactory) -> None:
        """The fork holds the history and layer state (not the usage record); writes to
        either thread never show in the other; an existing new_id is refused."""
        source, fork = _fresh(), _fresh()
        usage = ThreadUsage()
        usage.add("r", Usage(1, 1), 1, 0.0)
        state = codec.encode_state({"Layer": {"n": 1}, USAGE_KEY: usage.to_json()})
        async with opened(make_store) as store:
            await store.write(
                source,
                ThreadWrite(_users("a", "b"), state=state, checkpoint="cp"),
                expected_version=0,
            )
            assert await fork_thread(store, source, new_id=fork) == 1
            copy = await store.load_thread(fork)
            assert copy.messages == _users("a", "b")
            assert copy.checkpoint is None
            assert copy.state is not None
            assert dict(codec.decode_state(copy.state)) == {"Layer": {"n": 1}}
            await store.write(fork, ThreadWrite(_users("fork only")), expected_version=1)
            await store.write(source, ThreadWrite(_users("source only")), expected_version=1)
            assert (await store.load_thread(source)).messages == _users("a", "b", "source only")
            assert (await store.load_thread(fork)).messages == _users("a", "b", "fork only")
            with pytest.raises(ThreadExists):
                await fork_thread(store, source, new_id=fork)
            assert (await store.load_thread(fork)).version == 2

    async def test_a_fork_copies_the_notes_asked_for(self, make_store: StoreFactory) -> None:
        """notes={source namespace: target namespace} copies texts and metadata."""
        source, fork, ns = _fresh(), _fresh(), _fresh("ns")
        async with opened(make_store) as store:
            _require(store, Store)
            await store.append_note(ns, "likes tea", metadata={"k": 1})
            await store.write(source, ThreadWrite(_users("a")), expected_version=0)
            await fork_thread(store, source, new_id=fork, notes={ns: f"{ns}-fork"})
            (note,) = await store.notes(f"{ns}-fork")
            assert (note.text, dict(note.metadata)) == ("likes tea", {"k": 1})
            assert len(await store.notes(ns)) == 1

    async def test_rewind_archives_what_it_removes(self, make_store: StoreFactory) -> None:
        """The later messages leave the live log into the archive; the pause is dropped;
        a cut between a call and its result is refused."""
        thread = _fresh()
        history = _history([0, 2, 0])  # u0 a0 | u1 A r r | u2 a2
        docs = codec.encode_messages(history)
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(docs, checkpoint="cp"), expected_version=0)
            with pytest.raises(ValueError, match="to_message=4"):
                await rewind(store, thread, to_message=4)
            assert await rewind(store, thread, to_message=2) == 2
            record = await store.load_thread(thread)
            assert record.messages == docs[:2]
            assert record.checkpoint is None
            (archived,) = await store.archived(thread)
            assert (archived.version, archived.start, archived.end) == (2, 2, len(docs))
            assert archived.messages == docs[2:]

    # -- versions and time travel --------------------------------------------------------

    @PROPERTY
    @given(
        steps=st.lists(
            st.tuples(
                st.sampled_from(["append", "compact", "fork"]),
                st.integers(0, 3),
                st.integers(0, 50),
                st.integers(0, 50),
            ),
            min_size=1,
            max_size=12,
        )
    )
    async def test_as_of_a_version_is_what_a_reader_saw(
        self, make_store: StoreFactory, steps: list[tuple[str, int, int, int]]
    ) -> None:
        """For any writes, compactions and forks, load_as_of(v) is the thread a reader
        saw at v (its log, checkpoint and layer state), versions() lists each write with
        the run that wrote it, a fork at v starts from v's layer state, and a fork never
        changes its source."""
        thread = _fresh()
        seen: list[tuple[str, ...]] = [()]
        layers: list[tuple[str | None, str | None]] = [(None, None)]
        runs: list[str | None] = []
        forks: list[tuple[str, tuple[str, ...]]] = []
        counter = itertools.count()
        async with opened(make_store) as store:
            _require(store, ThreadVersionStore)
            for kind, count, a, b in steps:
                live = seen[-1]
                if kind == "fork":
                    at = a % len(seen)
                    fork = _fresh("fork")
                    if at == 0:
                        continue
                    await fork_thread(store, thread, new_id=fork, at_version=at)
                    forked_state = (await store.load_thread(fork)).state
                    assert forked_state == layers[at][1]  # none kept: a usage record alone
                    await store.write(fork, ThreadWrite(_users("in fork")), expected_version=1)
                    forks.append((fork, seen[at]))
                    continue
                new = _users(*(f"m{next(counter)}" for _ in range(count)))
                run = None if count == 2 else f"run-{a % 3},{b}"  # any text, commas too
                checkpoint, state = layers[-1]
                write_layers: dict[str, Any] = {}
                if b % 3 == 1:  # set, clear, or leave the checkpoint
                    checkpoint = write_layers["checkpoint"] = f"cp{next(counter)}"
                elif b % 3 == 2:
                    checkpoint = write_layers["checkpoint"] = None
                if a % 2:
                    state = write_layers["state"] = codec.encode_state({"n": next(counter)})
                if kind == "compact":
                    start = a % (len(live) + 1)
                    end = start + b % (len(live) - start + 1)
                    summary = _users(f"s{next(counter)}")
                    compaction = Compaction(start, end, summary)
                    change = ThreadWrite(new, compaction, run_id=run, **write_layers)
                    live = (*live[:start], *summary, *live[end:])
                else:
                    change = ThreadWrite(new, run_id=run, **write_layers)
                runs.append(run)
                layers.append((checkpoint, state))
                await store.write(thread, change, expected_version=len(seen) - 1)
                seen.append((*live, *new))
            if len(seen) == 1:
                return
            assert (await store.load_thread(thread)).messages == seen[-1]
            for version, messages in enumerate(seen):
                as_of = await load_as_of(store, thread, version)
                assert as_of.messages == messages
                assert (as_of.checkpoint, as_of.state) == layers[version]
            recorded = await store.versions(thread)
            assert [v.version for v in recorded] == list(range(1, len(seen)))
            assert [v.run_id for v in recorded] == runs
            for fork, messages in forks:
                assert (await store.load_thread(fork)).messages == (*messages, *_users("in fork"))

    async def test_pruning_drops_old_archived_originals(self, make_store: StoreFactory) -> None:
        """prune_archive(older_than=) removes ranges older than the age, keeps newer ones;
        versions before a pruned compaction are then out of reach."""
        thread = _fresh()
        async with opened(make_store) as store:
            _require(store, ArchivePruneStore)
            await store.write(thread, ThreadWrite(_users("a", "b")), expected_version=0)
            change = ThreadWrite(compaction=Compaction(0, 1, _users("sum")))
            await store.write(thread, change, expected_version=1)
            assert await store.prune_archive(thread, older_than=3600) == 0
            assert len(await store.archived(thread)) == 1
            assert await store.prune_archive(thread, older_than=0) == 1
            assert await store.archived(thread) == []
            assert (await store.load_thread(thread)).messages == _users("sum", "b")
            versioned = isinstance(store, ThreadVersionStore)
            if versioned:
                with pytest.raises(VersionUnavailable, match="archive"):
                    await load_as_of(store, thread, 1)
            with pytest.raises(ValueError, match="older_than"):
                await store.prune_archive(thread, older_than=-1)

    async def test_rewind_to_a_version_keeps_the_later_writes(
        self, make_store: StoreFactory
    ) -> None:
        """rewind_to_version makes an old log current; the replaced log is archived."""
        thread = _fresh()
        async with opened(make_store) as store:
            _require(store, ThreadVersionStore)
            await store.write(thread, ThreadWrite(_users("a")), expected_version=0)
            await store.write(thread, ThreadWrite(_users("b")), expected_version=1)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, _users("ab"))), expected_version=2
            )
            assert await rewind_to_version(store, thread, 1) == 4
            assert (await store.load_thread(thread)).messages == _users("a")
            assert (await load_as_of(store, thread, 3)).messages == _users("ab")
            assert (await store.archived(thread))[-1].messages == _users("ab")
            with pytest.raises(ValueError, match="version"):
                await load_as_of(store, thread, 9)

    async def test_as_of_an_old_version_ignores_writes_landing_meanwhile(
        self, make_store: StoreFactory
    ) -> None:
        """Reading an old version of a long thread (only what survives to it is read)
        answers the same while writers append and compact the thread concurrently."""
        thread = _fresh()
        async with opened(make_store) as store:
            _require(store, ThreadVersionStore)
            early = _users(*(f"e{i}" for i in range(3)))
            await store.write(thread, ThreadWrite(early), expected_version=0)
            tail = _users(*(f"t{i}" for i in range(40)))
            await store.write(thread, ThreadWrite(tail), expected_version=1)
            summary = ThreadWrite(compaction=Compaction(1, 2, _users("sum")))
            await store.write(thread, summary, expected_version=2)
            expected = {1: early, 2: (*early, *tail)}

            async def writer() -> None:
                for version in range(3, 23):
                    change = ThreadWrite(_users(f"w{version}"))
                    if version % 5 == 0:
                        change = ThreadWrite(change.append, Compaction(10, 12, _users("c")))
                    await store.write(thread, change, expected_version=version)

            async def reader() -> None:
                for index in range(20):
                    version = 1 + index % 2
                    got = await load_as_of(store, thread, version)
                    assert tuple(got.messages) == expected[version]

            async with anyio.create_task_group() as group:
                group.start_soon(writer)
                group.start_soon(reader)
            for version, messages in expected.items():
                assert tuple((await load_as_of(store, thread, version)).messages) == messages

    @PROPERTY
    @given(
        shape=st.lists(st.integers(0, 4), min_size=1, max_size=8),
        limit=st.integers(1, 12),
    )
    async def test_pages_cover_the_thread_pair_complete(
        self, make_store: StoreFactory, shape: list[int], limit: int
    ) -> None:
        """Paging from the newest to the oldest yields every message once, in order, and
        each page is pair-complete and holds at least min(limit, rest) messages."""
        thread = _fresh()
        history = _history(shape)
        async with opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(codec.encode_messages(history)), expected_version=0
            )
            pages = [await load_thread(store, thread, limit=limit)]
            while pages[-1].before is not None:
                pages.append(await load_thread(store, thread, limit=limit, before=pages[-1].before))
            seen = [m for page in reversed(pages) for m in page.messages]
            assert seen == history
            for page in pages:
                assert _pair_complete(page.messages)
                assert len(page.messages) >= min(limit, page.stop)
