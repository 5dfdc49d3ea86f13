"""Conformance suites for :class:`~tinyctx.Store` and :class:`~tinyctx.ThreadStore` backends.

Every backend (memory, SQLite, PostgreSQL, Redis, yours) is held to one behaviour by
subclassing these classes in a test module and overriding the ``make_store`` fixture::

    import pytest
    from tinyctx.testing.store_conformance import ThreadStoreConformance

    class TestMyBackend(ThreadStoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            async def make(*, archive_retention=None):
                return MyStore(tmp_path / "db", archive_retention=archive_retention)
            return make

``make_store`` returns an async factory: each call opens a store the test closes with
``aclose()``. Stores of one test may share data (one database), which the suite handles
by using fresh thread ids; ``open_peer(store)`` (override it) opens a *second* store object
on the same data, so concurrency is tested across connections or processes' worth of
clients, not only across tasks. Tests are ``async`` and marked ``anyio``: they run on
whatever ``anyio_backend`` the project's conftest provides.

Property tests (hypothesis) drive random threads (appends, compactions, checkpoints,
layer state, stale and fenced-out writes) against an in-memory model of the contract and
compare everything a store reports after every step.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Protocol, cast

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .. import codec
from ..errors import SessionBusy
from ..messages import Message, UserMessage, valid_text
from ..stores import NoteBatchStore, NoteDeleteStore, Store, append_notes
from ..threads import (
    UNCHANGED,
    Compaction,
    FencedOut,
    Lease,
    LeaseHeld,
    StaleThreadVersion,
    ThreadStore,
    ThreadWrite,
    Unchanged,
)
from .lifecycle_conformance import ThreadLifecycleConformance
from .store_safety import StoreSafetyConformance, ThreadSafetyConformance
from .strategies import checkpoints, histories, layer_states, texts

__all__ = ["StoreFactory", "StoreConformance", "ThreadStoreConformance", "ThreadModel"]


class StoreFactory(Protocol):
    """``await make_store(archive_retention=...)``: a new store object for one test."""

    def __call__(self, *, archive_retention: float | None = None) -> Awaitable[Any]: ...


_ids = itertools.count()


def _fresh(prefix: str = "t") -> str:
    """A thread id no other test or example uses (stores of one test may share data)."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"


# one factory per test function serves many hypothesis examples (fresh ids isolate them)
_PROPERTY = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@asynccontextmanager
async def _opened(make_store: StoreFactory, **options: Any) -> AsyncIterator[Any]:
    store = await make_store(**options)
    try:
        yield store
    finally:
        await store.aclose()


# ---------------------------------------------------------------------------------------
# Store (key/value data and notes)


@pytest.mark.anyio
class StoreConformance(StoreSafetyConformance):
    """The :class:`~tinyctx.Store` contract: namespaced JSON values and append-only notes
    (and :class:`~tinyctx.testing.store_safety.StoreSafetyConformance`: closing)."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Override: an async factory of the backend's stores (see the module docstring)."""
        raise NotImplementedError("a conformance subclass must override the make_store fixture")

    async def test_implements_the_protocols(self, make_store: StoreFactory) -> None:
        """The backend is a Store and appends note batches atomically."""
        async with _opened(make_store) as store:
            assert isinstance(store, Store)
            assert isinstance(store, NoteBatchStore)

    async def test_values_round_trip_per_namespace(self, make_store: StoreFactory) -> None:
        """JSON values come back equal, per namespace; a missing key is None."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            value = {"a": [1, 2, {"b": None}], "text": "日本語 ✓", "n": 1.5, "ok": True}
            await store.put(ns, "k", value)
            await store.put(f"{ns}-2", "k", "other")
            assert await store.get(ns, "k") == value
            assert await store.get(f"{ns}-2", "k") == "other"
            assert await store.get(ns, "missing") is None
            assert await store.get(f"{ns}-nowhere", "k") is None

    async def test_put_overwrites_and_returned_values_are_copies(
        self, make_store: StoreFactory
    ) -> None:
        """Changing a value read back does not change the stored one; put overwrites."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            await store.put(ns, "k", {"items": [1]})
            got = await store.get(ns, "k")
            got["items"].append(2)
            assert await store.get(ns, "k") == {"items": [1]}
            await store.put(ns, "k", {"items": [3]})
            assert await store.get(ns, "k") == {"items": [3]}

    async def test_keys_are_sorted_and_delete_reports_existence(
        self, make_store: StoreFactory
    ) -> None:
        """keys() is sorted; delete() says whether the key existed."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            for key in ["b", "a", "c"]:
                await store.put(ns, key, key)
            assert await store.keys(ns) == ["a", "b", "c"]
            assert await store.delete(ns, "b") is True
            assert await store.delete(ns, "b") is False
            assert await store.keys(ns) == ["a", "c"]
            assert await store.keys(f"{ns}-empty") == []

    async def test_notes_have_a_sequence_per_namespace(self, make_store: StoreFactory) -> None:
        """Notes are numbered from 1 per namespace, timestamped, with their metadata."""
        ns, other = _fresh("ns"), _fresh("ns")
        async with _opened(make_store) as store:
            first = await store.append_note(ns, "one", metadata={"by": "test"})
            await store.append_note(other, "elsewhere")
            second = await store.append_note(ns, "two")
            assert (first.seq, second.seq) == (1, 2)
            assert first.metadata == {"by": "test"}
            assert second.metadata == {}
            notes = await store.notes(ns)
            assert [(n.namespace, n.seq, n.text) for n in notes] == [(ns, 1, "one"), (ns, 2, "two")]
            assert notes[0].created_at <= notes[1].created_at
            assert [n.text for n in await store.notes(other)] == ["elsewhere"]
            assert await store.notes(f"{ns}-empty") == []

    async def test_delete_notes_erases_one_namespace(self, make_store: StoreFactory) -> None:
        """delete_notes removes one namespace's notes (one user's data), nothing else, and
        numbering starts again at 1; a backend without it is simply not a NoteDeleteStore."""
        ns, other = _fresh("ns"), _fresh("ns")
        async with _opened(make_store) as store:
            erases = isinstance(store, NoteDeleteStore)
            if not erases:
                pytest.skip("the backend does not implement the optional NoteDeleteStore")
            eraser = cast(NoteDeleteStore, store)
            await append_notes(store, ns, ["a", "b", "c"])
            await store.append_note(other, "kept")
            assert await eraser.delete_notes(ns) == 3
            assert await eraser.delete_notes(ns) == 0
            assert await store.notes(ns) == []
            assert [n.text for n in await store.notes(other)] == ["kept"]
            again = await store.append_note(ns, "fresh")
            assert again.seq == 1

    async def test_limit_keeps_the_newest_in_order(self, make_store: StoreFactory) -> None:
        """notes(limit=n) is the newest n, oldest first; a negative limit is refused."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            for index in range(5):
                await store.append_note(ns, f"n{index}")
            assert [n.text for n in await store.notes(ns, limit=2)] == ["n3", "n4"]
            assert [n.text for n in await store.notes(ns, limit=50)] == [f"n{i}" for i in range(5)]
            with pytest.raises(ValueError, match="limit"):
                await store.notes(ns, limit=-1)

    async def test_limit_zero_returns_no_notes(self, make_store: StoreFactory) -> None:
        """notes(limit=0) asks for none and gets none; only limit=None means every note."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            for index in range(3):
                await store.append_note(ns, f"n{index}")
            assert await store.notes(ns, limit=0) == []
            assert len(await store.notes(ns, limit=None)) == 3
            with pytest.raises(ValueError, match="integer >= 0"):
                await store.notes(ns, limit=-5)

    async def test_a_lone_surrogate_in_a_note_is_made_valid(self, make_store: StoreFactory) -> None:
        """A note with a lone surrogate is kept with U+FFFD in its place, batch and all."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            notes = await append_notes(store, ns, ["caf\udce9", "ok"])
            await store.append_note(ns, "\ud800 alone")
            assert [n.text for n in notes] == ["caf\ufffd", "ok"]
            texts = [n.text for n in await store.notes(ns)]
            assert texts == ["caf\ufffd", "ok", "\ufffd alone"]

    async def test_append_notes_is_one_batch_with_consecutive_seqs(
        self, make_store: StoreFactory
    ) -> None:
        """A batch gets consecutive sequence numbers and shared metadata."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            await store.append_note(ns, "before")
            notes = await append_notes(store, ns, ["a", "b", "c"], metadata={"batch": 1})
            assert [(n.seq, n.text) for n in notes] == [(2, "a"), (3, "b"), (4, "c")]
            assert all(n.metadata == {"batch": 1} for n in notes)
            assert await append_notes(store, ns, []) == []
            assert len(await store.notes(ns)) == 4

    async def test_append_notes_rejects_non_strings_and_writes_nothing(
        self, make_store: StoreFactory
    ) -> None:
        """A batch with a non-string is refused whole, before anything is written."""
        ns = _fresh("ns")
        async with _opened(make_store) as store:
            with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
                await store.append_notes(ns, ["ok", 3])
            with pytest.raises(TypeError, match="not one string"):
                await store.append_notes(ns, "abc")
            assert await store.notes(ns) == []


# ---------------------------------------------------------------------------------------
# the model a ThreadStore is compared with


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


async def _assert_matches(store: ThreadStore, thread_id: str, model: ThreadModel) -> None:
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
_Step = tuple[Any, ...]

_MESSAGE_DOCS = histories(max_turns=4).map(codec.encode_messages)
_CHECKPOINT_DOCS = st.one_of(
    st.just(UNCHANGED), st.none(), checkpoints().map(codec.encode_checkpoint)
)
_STATE_DOCS = st.one_of(st.just(UNCHANGED), layer_states().map(codec.encode_state))


@st.composite
def _steps(draw: st.DrawFn) -> list[_Step]:
    """A thread's life: writes (append, compaction, checkpoint, state) and refused ones."""
    steps: list[_Step] = []
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


# ---------------------------------------------------------------------------------------
# ThreadStore


def _docs(*texts: str) -> tuple[str, ...]:
    return codec.encode_messages(UserMessage(text) for text in texts)


def _texts(docs: tuple[str, ...]) -> list[str]:
    return [m.text for m in codec.decode_messages(docs)]


@pytest.mark.anyio
class ThreadStoreConformance(ThreadLifecycleConformance, ThreadSafetyConformance):
    """The :class:`~tinyctx.ThreadStore` contract: atomic versioned writes, compaction with
    an archive, checkpoint and layer state, leases with fencing tokens, list and delete (and
    :class:`~tinyctx.testing.store_safety.ThreadSafetyConformance`: closing, thread ids)."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Override: an async factory of the backend's stores (see the module docstring)."""
        raise NotImplementedError("a conformance subclass must override the make_store fixture")

    async def open_peer(self, store: Any) -> Any:
        """Override: a second store object on ``store``'s data (another connection)."""
        return store

    async def close_peer(self, store: Any, peer: Any) -> None:
        if peer is not store:
            await peer.aclose()

    # -- basics --------------------------------------------------------------------------

    async def test_implements_the_protocol(self, make_store: StoreFactory) -> None:
        """The backend is a ThreadStore."""
        async with _opened(make_store) as store:
            assert isinstance(store, ThreadStore)

    async def test_an_unknown_thread_is_empty_at_version_0(self, make_store: StoreFactory) -> None:
        """Loading a thread never written gives an empty record; delete reports False."""
        thread = _fresh()
        async with _opened(make_store) as store:
            record = await store.load_thread(thread)
            assert (record.thread_id, record.version, record.messages) == (thread, 0, ())
            assert (record.checkpoint, record.state, record.lease) == (None, None, None)
            assert await store.archived(thread) == []
            assert await store.delete_thread(thread) is False

    async def test_appends_keep_order_and_bump_the_version(self, make_store: StoreFactory) -> None:
        """Each write returns expected_version + 1; the log is every append in order."""
        thread = _fresh()
        async with _opened(make_store) as store:
            assert await store.write(thread, ThreadWrite(_docs("a", "b")), expected_version=0) == 1
            assert await store.write(thread, ThreadWrite(_docs("c")), expected_version=1) == 2
            assert await store.write(thread, ThreadWrite(), expected_version=2) == 3
            record = await store.load_thread(thread)
            assert record.version == 3
            assert _texts(record.messages) == ["a", "b", "c"]

    async def test_documents_come_back_byte_for_byte(self, make_store: StoreFactory) -> None:
        """Any string (non-ASCII, quotes, control characters, a megabyte) is stored exactly."""
        thread = _fresh()
        odd = ('{"v":1}', "日本語 🙂 \\ \" '", "tab\tnewline\n", "x" * 1_000_000, "")
        async with _opened(make_store) as store:
            change = ThreadWrite(odd, checkpoint=odd[1], state=odd[2])
            await store.write(thread, change, expected_version=0)
            record = await store.load_thread(thread)
            assert record.messages == odd
            assert (record.checkpoint, record.state) == (odd[1], odd[2])

    async def test_a_stale_write_is_refused_and_changes_nothing(
        self, make_store: StoreFactory
    ) -> None:
        """A write against a version the thread moved past raises StaleThreadVersion."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(thread, ThreadWrite(_docs("a"), state="s1"), expected_version=0)
            before = await store.load_thread(thread)
            for wrong in (0, 2, 7):
                change = ThreadWrite(
                    _docs("x"), Compaction(0, 1, _docs("y")), checkpoint="cp", state="s2"
                )
                with pytest.raises(StaleThreadVersion) as info:
                    await store.write(thread, change, expected_version=wrong)
                assert (info.value.expected, info.value.actual) == (wrong, 1)
                assert info.value.thread_id == thread
            assert await store.load_thread(thread) == before
            assert await store.archived(thread) == []

    async def test_compaction_replaces_a_range_and_archives_it(
        self, make_store: StoreFactory
    ) -> None:
        """A compaction replaces [start, end), applies before the append, and is archived."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(_docs("s", "a", "b", "c", "d")), expected_version=0
            )
            change = ThreadWrite(_docs("e"), Compaction(1, 4, _docs("summary")))
            assert await store.write(thread, change, expected_version=1) == 2
            record = await store.load_thread(thread)
            assert _texts(record.messages) == ["s", "summary", "d", "e"]
            (archived,) = await store.archived(thread)
            assert (archived.version, archived.start, archived.end) == (2, 1, 4)
            assert _texts(archived.messages) == ["a", "b", "c"]
            assert archived.archived_at > 0
            # an insertion (empty range) replaces nothing and archives nothing
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 0, _docs("first"))), expected_version=2
            )
            assert _texts((await store.load_thread(thread)).messages)[:2] == ["first", "s"]
            assert len(await store.archived(thread)) == 1

    async def test_a_compaction_outside_the_log_is_refused(self, make_store: StoreFactory) -> None:
        """A range past the end (or reversed) raises ValueError and applies nothing."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(thread, ThreadWrite(_docs("a", "b")), expected_version=0)
            before = await store.load_thread(thread)
            for start, end in ((1, 3), (2, 1), (-1, 1)):
                change = ThreadWrite(_docs("z"), Compaction(start, end, ()), state="s")
                with pytest.raises(ValueError, match="outside the live log"):
                    await store.write(thread, change, expected_version=1)
            assert await store.load_thread(thread) == before

    async def test_checkpoint_and_state_are_set_kept_and_cleared(
        self, make_store: StoreFactory
    ) -> None:
        """checkpoint: str stores, None clears, UNCHANGED keeps; state: str stores, UNCHANGED
        keeps."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(checkpoint="cp1", state="st1"), expected_version=0
            )
            await store.write(thread, ThreadWrite(_docs("a")), expected_version=1)
            record = await store.load_thread(thread)
            assert (record.checkpoint, record.state) == ("cp1", "st1")
            await store.write(thread, ThreadWrite(checkpoint=None, state="st2"), expected_version=2)
            record = await store.load_thread(thread)
            assert (record.checkpoint, record.state) == (None, "st2")

    async def test_bad_arguments_are_refused_before_anything(
        self, make_store: StoreFactory
    ) -> None:
        """Non-str documents, a negative version, an empty id: TypeError/ValueError, no write."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(thread, ThreadWrite(_docs("a")), expected_version=0)
            before = await store.load_thread(thread)
            bad: list[tuple[type[Exception], str, ThreadWrite, int]] = [
                (TypeError, thread, ThreadWrite(("ok", b"bytes")), 1),  # type: ignore[arg-type]
                (TypeError, thread, ThreadWrite(compaction=Compaction(0, 1, (1,))), 1),  # type: ignore[arg-type]
                (TypeError, thread, ThreadWrite(checkpoint=3), 1),  # type: ignore[arg-type]
                (TypeError, thread, ThreadWrite(state=None), 1),  # type: ignore[arg-type]
                (ValueError, thread, ThreadWrite(), -1),
                (ValueError, "", ThreadWrite(), 0),
            ]
            for error, tid, change, version in bad:
                with pytest.raises(error):
                    await store.write(tid, change, expected_version=version)
            assert await store.load_thread(thread) == before

    # -- leases --------------------------------------------------------------------------

    async def test_a_live_lease_refuses_another_owner(self, make_store: StoreFactory) -> None:
        """LeaseHeld (a SessionBusy) names the thread and the owner holding it."""
        thread = _fresh()
        async with _opened(make_store) as store:
            lease = await store.acquire_lease(thread, "worker-a", 60)
            assert (lease.thread_id, lease.owner) == (thread, "worker-a")
            with pytest.raises(LeaseHeld) as info:
                await store.acquire_lease(thread, "worker-b", 60)
            assert isinstance(info.value, SessionBusy)
            assert (info.value.thread_id, info.value.owner) == (thread, "worker-a")
            assert "worker-a" in str(info.value)
            assert thread in str(info.value)
            assert (await store.load_thread(thread)).lease == lease

    async def test_the_same_owner_gets_a_new_token_and_fences_the_old(
        self, make_store: StoreFactory
    ) -> None:
        """Re-acquiring gives a newer token at once; writes under the old token are refused."""
        thread = _fresh()
        async with _opened(make_store) as store:
            old = await store.acquire_lease(thread, "w", 60)
            new = await store.acquire_lease(thread, "w", 60)
            assert new.token > old.token
            with pytest.raises(FencedOut) as info:
                await store.write(thread, ThreadWrite(_docs("a")), expected_version=0, lease=old)
            assert (info.value.token, info.value.current) == (old.token, new.token)
            await store.write(thread, ThreadWrite(_docs("a")), expected_version=0, lease=new)
            assert (await store.load_thread(thread)).version == 1

    async def test_tokens_increase_across_threads_and_survive_delete(
        self, make_store: StoreFactory
    ) -> None:
        """Fencing tokens are strictly increasing over every lease the store grants."""
        threads = [_fresh() for _ in range(3)]
        async with _opened(make_store) as store:
            tokens = []
            for thread in threads * 2:
                lease = await store.acquire_lease(thread, "w", 60)
                tokens.append(lease.token)
                await store.write(thread, ThreadWrite(_docs("x")), expected_version=0, lease=lease)
                await store.delete_thread(thread)
            assert tokens == sorted(tokens)
            assert len(set(tokens)) == len(tokens)

    async def test_a_fenced_out_writer_applies_nothing(self, make_store: StoreFactory) -> None:
        """Under a replaced lease, no part of a write (compaction, append, checkpoint, state)
        lands."""
        thread = _fresh()
        async with _opened(make_store) as store:
            first = await store.acquire_lease(thread, "a", 60)
            await store.write(thread, ThreadWrite(_docs("a", "b")), expected_version=0, lease=first)
            await store.release_lease(first)
            second = await store.acquire_lease(thread, "b", 60)
            before = await store.load_thread(thread)
            change = ThreadWrite(
                _docs("late"), Compaction(0, 2, _docs("sum")), checkpoint="cp", state="st"
            )
            with pytest.raises(FencedOut):
                await store.write(thread, change, expected_version=1, lease=first)
            assert await store.load_thread(thread) == before
            assert await store.archived(thread) == []
            assert before.lease == second

    async def test_a_fenced_out_note_append_writes_nothing(self, make_store: StoreFactory) -> None:
        """A note batch fenced by a replaced or released lease is refused whole (FencedOut,
        no note, no seq used); under the thread's newest lease it is appended."""
        thread, ns = _fresh(), _fresh("ns")
        async with _opened(make_store) as store:
            old = await store.acquire_lease(thread, "a", 60)
            first = await append_notes(store, ns, ["one"], fence=old)
            assert [n.seq for n in first] == [1]
            await store.release_lease(old)
            with pytest.raises(FencedOut) as released:
                await store.append_notes(ns, ["late"], fence=old)
            assert released.value.current is None
            new = await store.acquire_lease(thread, "b", 60)
            with pytest.raises(FencedOut) as replaced:
                await append_notes(store, ns, ["late", "later"], fence=old)
            assert replaced.value.current == new.token
            assert [n.text for n in await store.notes(ns)] == ["one"]
            renewed = await store.renew_lease(new, 60)
            kept = await append_notes(store, ns, ["two"], fence=renewed)
            assert [(n.seq, n.text) for n in kept] == [(2, "two")]
            with pytest.raises(TypeError, match="fence"):
                await store.append_notes(ns, ["x"], fence=new.token)
            assert len(await store.notes(ns)) == 2

    @_PROPERTY
    @given(batches=st.lists(st.lists(texts(40), min_size=1, max_size=4), min_size=1, max_size=4))
    async def test_only_the_newest_lease_appends_notes(
        self, make_store: StoreFactory, batches: list[list[str]]
    ) -> None:
        """Batches alternately fenced by a stale and the newest lease: exactly the newest
        lease's batches are stored, in order, with consecutive seqs."""
        thread, ns = _fresh(), _fresh("ns")
        async with _opened(make_store) as store:
            stale = await store.acquire_lease(thread, "old", 60)
            newest = await store.acquire_lease(thread, "old", 60)
            expected: list[str] = []
            for batch in batches:
                with pytest.raises(FencedOut):
                    await store.append_notes(ns, batch, fence=stale)
                await store.append_notes(ns, batch, fence=newest)
                expected += [valid_text(text) for text in batch]
            notes = await store.notes(ns)
            assert [n.text for n in notes] == expected
            assert [n.seq for n in notes] == list(range(1, len(expected) + 1))

    async def test_release_and_renew(self, make_store: StoreFactory) -> None:
        """Renew keeps the token and extends the expiry; a released lease neither writes nor
        renews; releasing twice, or a replaced lease, is a no-op."""
        thread = _fresh()
        async with _opened(make_store) as store:
            lease = await store.acquire_lease(thread, "w", 5)
            renewed = await store.renew_lease(lease, 60)
            assert renewed.token == lease.token
            assert renewed.expires_at > lease.expires_at
            await store.release_lease(renewed)
            await store.release_lease(renewed)
            assert (await store.load_thread(thread)).lease is None
            with pytest.raises(FencedOut) as info:
                await store.write(thread, ThreadWrite(), expected_version=0, lease=renewed)
            assert info.value.current is None
            with pytest.raises(FencedOut):
                await store.renew_lease(renewed, 60)
            other = await store.acquire_lease(thread, "other", 60)
            await store.release_lease(lease)  # replaced long ago: must not drop `other`
            assert (await store.load_thread(thread)).lease == other
            with pytest.raises(ValueError, match="ttl"):
                await store.acquire_lease(thread, "x", 0)

    async def test_an_expired_lease_can_be_taken_over(self, make_store: StoreFactory) -> None:
        """After its TTL another owner acquires the thread and the old holder is fenced out."""
        thread = _fresh()
        async with _opened(make_store) as store:
            dead = await store.acquire_lease(thread, "killed-worker", 0.05)
            await store.write(thread, ThreadWrite(_docs("a")), expected_version=0, lease=dead)
            await anyio.sleep(0.2)
            record = await store.load_thread(thread)
            assert record.lease == dead  # kept, expired, until someone takes over
            taken = await store.acquire_lease(thread, "new-worker", 60)
            assert taken.token > dead.token
            with pytest.raises(FencedOut):
                await store.write(thread, ThreadWrite(_docs("b")), expected_version=1, lease=dead)
            with pytest.raises(FencedOut):
                await store.renew_lease(dead, 60)
            await store.write(thread, ThreadWrite(_docs("b")), expected_version=1, lease=taken)
            assert _texts((await store.load_thread(thread)).messages) == ["a", "b"]

    # -- list and delete -----------------------------------------------------------------

    async def test_list_threads_sorted_with_prefix_and_limit(
        self, make_store: StoreFactory
    ) -> None:
        """Written threads are listed in order; a lease alone does not list a thread."""
        prefix = _fresh("user")
        names = [f"{prefix}/b", f"{prefix}/a", f"{prefix}/c", f"{prefix}x/d"]
        async with _opened(make_store) as store:
            for name in names:
                await store.write(name, ThreadWrite(_docs("m")), expected_version=0)
            await store.acquire_lease(f"{prefix}/lease-only", "w", 60)
            assert await store.list_threads(prefix=f"{prefix}/") == sorted(names[:3])
            assert await store.list_threads(prefix=prefix) == sorted(names)
            assert await store.list_threads(prefix=f"{prefix}/", limit=2) == sorted(names[:3])[:2]
            assert await store.list_threads(prefix=f"{prefix}/", limit=0) == []
            assert set(names) <= set(await store.list_threads())
            with pytest.raises(ValueError, match="limit"):
                await store.list_threads(limit=-1)

    async def test_delete_leaves_nothing_behind(self, make_store: StoreFactory) -> None:
        """Messages, archive, checkpoint, state and lease go; the id can start over at 0."""
        thread = _fresh()
        async with _opened(make_store) as store:
            lease = await store.acquire_lease(thread, "w", 60)
            await store.write(
                thread,
                ThreadWrite(_docs("a", "b", "c"), checkpoint="cp", state="st"),
                expected_version=0,
                lease=lease,
            )
            await store.write(
                thread,
                ThreadWrite(compaction=Compaction(0, 2, _docs("s"))),
                expected_version=1,
                lease=lease,
            )
            assert await store.delete_thread(thread) is True
            record = await store.load_thread(thread)
            assert (record.version, record.messages, record.checkpoint) == (0, (), None)
            assert (record.state, record.lease) == (None, None)
            assert await store.archived(thread) == []
            assert thread not in await store.list_threads(prefix=thread)
            assert await store.delete_thread(thread) is False
            with pytest.raises(FencedOut):
                await store.write(thread, ThreadWrite(), expected_version=0, lease=lease)
            assert await store.write(thread, ThreadWrite(_docs("new")), expected_version=0) == 1
            lease_only = _fresh()
            await store.acquire_lease(lease_only, "w", 60)
            assert await store.delete_thread(lease_only) is True
            assert (await store.load_thread(lease_only)).lease is None

    # -- archive retention ----------------------------------------------------------------

    async def test_archive_is_oldest_first_and_kept_without_retention(
        self, make_store: StoreFactory
    ) -> None:
        """Several compactions are archived in order with the versions they produced."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.write(thread, ThreadWrite(_docs("a", "b", "c", "d")), expected_version=0)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, _docs("s1"))), expected_version=1
            )
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, _docs("s2"))), expected_version=2
            )
            archived = await store.archived(thread)
            assert [(a.version, _texts(a.messages)) for a in archived] == [
                (2, ["a", "b"]),
                (3, ["s1", "c"]),
            ]

    async def test_retention_drops_old_archives(self, make_store: StoreFactory) -> None:
        """With archive_retention, ranges older than it are no longer returned."""
        thread = _fresh()
        async with _opened(make_store, archive_retention=0.05) as store:
            await store.write(thread, ThreadWrite(_docs("a", "b", "c")), expected_version=0)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, _docs("s"))), expected_version=1
            )
            await anyio.sleep(0.2)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 1, _docs("t"))), expected_version=2
            )
            archived = await store.archived(thread)
            assert [(a.version, _texts(a.messages)) for a in archived] == [(3, ["s"])]
            await anyio.sleep(0.2)
            assert await store.archived(thread) == []
            assert _texts((await store.load_thread(thread)).messages) == ["t", "c"]

    # -- concurrency ---------------------------------------------------------------------

    async def test_concurrent_writers_one_winner_per_version(
        self, make_store: StoreFactory
    ) -> None:
        """Writers racing on one thread (two store objects): exactly one wins each version,
        and the log is exactly the winners' appends in version order."""
        thread = _fresh()
        async with _opened(make_store) as store:
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
        thread = _fresh()
        async with _opened(make_store) as store:
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

    @_PROPERTY
    @given(steps=_steps())
    async def test_any_thread_reloads_as_the_model(
        self, make_store: StoreFactory, steps: list[_Step]
    ) -> None:
        """Any sequence of writes (messages, compactions, checkpoints, layer state), stale
        writes and out-of-range compactions leaves the store equal to the model after every
        step; refused writes change nothing; every document decodes to what was encoded."""
        thread = _fresh()
        model = ThreadModel()
        async with _opened(make_store) as store:
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
                await _assert_matches(store, thread, model)
            record = await store.load_thread(thread)
            decoded: tuple[Message, ...] = codec.decode_messages(record.messages)
            assert codec.encode_messages(decoded) == record.messages
            if record.checkpoint is not None:
                assert codec.encode_checkpoint(codec.decode_checkpoint(record.checkpoint)) == (
                    record.checkpoint
                )
            if record.state is not None:
                assert codec.encode_state(codec.decode_state(record.state)) == record.state

    @_PROPERTY
    @given(steps=_steps(), data=st.data())
    async def test_a_fenced_out_write_never_lands(
        self, make_store: StoreFactory, steps: list[_Step], data: st.DataObject
    ) -> None:
        """Whatever a fenced-out writer sends, the thread stays exactly as it was."""
        thread = _fresh()
        model = ThreadModel()
        async with _opened(make_store) as store:
            old = await store.acquire_lease(thread, "old", 60)
            for step in steps:
                if step[0] == "write":
                    await store.write(thread, step[1], expected_version=model.version, lease=old)
                    model.apply(step[1])
            current: Lease = await store.acquire_lease(thread, "old", 60)
            late = data.draw(st.sampled_from(steps))[1]
            with pytest.raises(FencedOut):
                await store.write(thread, late, expected_version=model.version, lease=old)
            await _assert_matches(store, thread, model)
            assert (await store.load_thread(thread)).lease == current
