"""Conformance suites for :class:`~tinyctx.Store` and :class:`~tinyctx.ThreadStore` backends.

Every backend (memory, SQLite, PostgreSQL, Redis, yours) is held to one behaviour by
subclassing these classes in a test module and overriding the ``make_store`` fixture::

    import pytest
    from tinyctx.testing.store_conformance import ThreadStoreConformance

    class TestMyBackend(ThreadStoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            async def make(*, archive_retention=None, ttl=None):
                return MyStore(tmp_path / "db", archive_retention=archive_retention, ttl=ttl)
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

from typing import cast

import anyio
import pytest

from ..store_protocols import NoteBatchStore, NoteDeleteStore, Store, append_notes
from ..threads import (
    Compaction,
    FencedOut,
    StaleThreadVersion,
    ThreadStore,
    ThreadWrite,
)
from ._store_kit import StoreFactory, docs_of, fresh_id, opened, texts_of
from .expiry_conformance import ThreadExpiryConformance
from .lease_conformance import ThreadLeaseConformance
from .lifecycle_conformance import ThreadLifecycleConformance
from .retention_conformance import ThreadRetentionConformance
from .store_safety import StoreSafetyConformance, ThreadSafetyConformance
from .thread_properties import ThreadModel, ThreadPropertyConformance

__all__ = ["StoreFactory", "StoreConformance", "ThreadStoreConformance", "ThreadModel"]


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
        async with opened(make_store) as store:
            assert isinstance(store, Store)
            assert isinstance(store, NoteBatchStore)

    async def test_values_round_trip_per_namespace(self, make_store: StoreFactory) -> None:
        """JSON values come back equal, per namespace; a missing key is None."""
        ns = fresh_id("ns")
        async with opened(make_store) as store:
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
        ns = fresh_id("ns")
        async with opened(make_store) as store:
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
        ns = fresh_id("ns")
        async with opened(make_store) as store:
            for key in ["b", "a", "c"]:
                await store.put(ns, key, key)
            assert await store.keys(ns) == ["a", "b", "c"]
            assert await store.delete(ns, "b") is True
            assert await store.delete(ns, "b") is False
            assert await store.keys(ns) == ["a", "c"]
            assert await store.keys(f"{ns}-empty") == []

    async def test_notes_have_a_sequence_per_namespace(self, make_store: StoreFactory) -> None:
        """Notes are numbered from 1 per namespace, timestamped, with their metadata."""
        ns, other = fresh_id("ns"), fresh_id("ns")
        async with opened(make_store) as store:
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
        ns, other = fresh_id("ns"), fresh_id("ns")
        async with opened(make_store) as store:
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
        ns = fresh_id("ns")
        async with opened(make_store) as store:
            for index in range(5):
                await store.append_note(ns, f"n{index}")
            assert [n.text for n in await store.notes(ns, limit=2)] == ["n3", "n4"]
            assert [n.text for n in await store.notes(ns, limit=50)] == [f"n{i}" for i in range(5)]
            with pytest.raises(ValueError, match="limit"):
                await store.notes(ns, limit=-1)

    async def test_limit_zero_returns_no_notes(self, make_store: StoreFactory) -> None:
        """notes(limit=0) asks for none and gets none; only limit=None means every note."""
        ns = fresh_id("ns")
        async with opened(make_store) as store:
            for index in range(3):
                await store.append_note(ns, f"n{index}")
            assert await store.notes(ns, limit=0) == []
            assert len(await store.notes(ns, limit=None)) == 3
            with pytest.raises(ValueError, match="integer >= 0"):
                await store.notes(ns, limit=-5)

    async def test_a_lone_surrogate_in_a_note_is_made_valid(self, make_store: StoreFactory) -> None:
        """A note with a lone surrogate is kept with U+FFFD in its place, batch and all."""
        ns = fresh_id("ns")
        async with opened(make_store) as store:
            notes = await append_notes(store, ns, ["caf\udce9", "ok"])
            await store.append_note(ns, "\ud800 alone")
            assert [n.text for n in notes] == ["caf\ufffd", "ok"]
            texts = [n.text for n in await store.notes(ns)]
            assert texts == ["caf\ufffd", "ok", "\ufffd alone"]

    async def test_append_notes_is_one_batch_with_consecutive_seqs(
        self, make_store: StoreFactory
    ) -> None:
        """A batch gets consecutive sequence numbers and shared metadata."""
        ns = fresh_id("ns")
        async with opened(make_store) as store:
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
        ns = fresh_id("ns")
        async with opened(make_store) as store:
            with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
                await store.append_notes(ns, ["ok", 3])
            with pytest.raises(TypeError, match="not one string"):
                await store.append_notes(ns, "abc")
            assert await store.notes(ns) == []


# ---------------------------------------------------------------------------------------
# ThreadStore


@pytest.mark.anyio
class ThreadStoreConformance(
    ThreadLeaseConformance,
    ThreadPropertyConformance,
    ThreadRetentionConformance,
    ThreadExpiryConformance,
    ThreadLifecycleConformance,
    ThreadSafetyConformance,
):
    """The :class:`~tinyctx.ThreadStore` contract: atomic versioned writes, compaction with
    an archive, checkpoint and layer state, leases with fencing tokens, list and delete (and
    :class:`~tinyctx.testing.store_safety.ThreadSafetyConformance`: closing, thread ids)."""

    # -- basics --------------------------------------------------------------------------

    async def test_implements_the_protocol(self, make_store: StoreFactory) -> None:
        """The backend is a ThreadStore."""
        async with opened(make_store) as store:
            assert isinstance(store, ThreadStore)

    async def test_an_unknown_thread_is_empty_at_version_0(self, make_store: StoreFactory) -> None:
        """Loading a thread never written gives an empty record; delete reports False."""
        thread = fresh_id()
        async with opened(make_store) as store:
            record = await store.load_thread(thread)
            assert (record.thread_id, record.version, record.messages) == (thread, 0, ())
            assert (record.checkpoint, record.state, record.lease) == (None, None, None)
            assert await store.archived(thread) == []
            assert await store.delete_thread(thread) is False

    async def test_appends_keep_order_and_bump_the_version(self, make_store: StoreFactory) -> None:
        """Each write returns expected_version + 1; the log is every append in order."""
        thread = fresh_id()
        async with opened(make_store) as store:
            assert (
                await store.write(thread, ThreadWrite(docs_of("a", "b")), expected_version=0) == 1
            )
            assert await store.write(thread, ThreadWrite(docs_of("c")), expected_version=1) == 2
            assert await store.write(thread, ThreadWrite(), expected_version=2) == 3
            record = await store.load_thread(thread)
            assert record.version == 3
            assert texts_of(record.messages) == ["a", "b", "c"]

    async def test_documents_come_back_byte_for_byte(self, make_store: StoreFactory) -> None:
        """Any string (non-ASCII, quotes, control characters, a megabyte) is stored exactly."""
        thread = fresh_id()
        odd = ('{"v":1}', "日本語 🙂 \\ \" '", "tab\tnewline\n", "x" * 1_000_000, "")
        async with opened(make_store) as store:
            change = ThreadWrite(odd, checkpoint=odd[1], state=odd[2])
            await store.write(thread, change, expected_version=0)
            record = await store.load_thread(thread)
            assert record.messages == odd
            assert (record.checkpoint, record.state) == (odd[1], odd[2])

    async def test_a_stale_write_is_refused_and_changes_nothing(
        self, make_store: StoreFactory
    ) -> None:
        """A write against a version the thread moved past raises StaleThreadVersion."""
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(docs_of("a"), state="s1"), expected_version=0)
            before = await store.load_thread(thread)
            for wrong in (0, 2, 7):
                change = ThreadWrite(
                    docs_of("x"), Compaction(0, 1, docs_of("y")), checkpoint="cp", state="s2"
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
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(docs_of("s", "a", "b", "c", "d")), expected_version=0
            )
            change = ThreadWrite(docs_of("e"), Compaction(1, 4, docs_of("summary")))
            assert await store.write(thread, change, expected_version=1) == 2
            record = await store.load_thread(thread)
            assert texts_of(record.messages) == ["s", "summary", "d", "e"]
            (archived,) = await store.archived(thread)
            assert (archived.version, archived.start, archived.end) == (2, 1, 4)
            assert texts_of(archived.messages) == ["a", "b", "c"]
            assert archived.archived_at > 0
            # an insertion (empty range) replaces nothing and archives nothing
            await store.write(
                thread,
                ThreadWrite(compaction=Compaction(0, 0, docs_of("first"))),
                expected_version=2,
            )
            assert texts_of((await store.load_thread(thread)).messages)[:2] == ["first", "s"]
            assert len(await store.archived(thread)) == 1

    async def test_a_compaction_outside_the_log_is_refused(self, make_store: StoreFactory) -> None:
        """A range past the end (or reversed) raises ValueError and applies nothing."""
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(docs_of("a", "b")), expected_version=0)
            before = await store.load_thread(thread)
            for start, end in ((1, 3), (2, 1), (-1, 1)):
                change = ThreadWrite(docs_of("z"), Compaction(start, end, ()), state="s")
                with pytest.raises(ValueError, match="outside the live log"):
                    await store.write(thread, change, expected_version=1)
            assert await store.load_thread(thread) == before

    async def test_checkpoint_and_state_are_set_kept_and_cleared(
        self, make_store: StoreFactory
    ) -> None:
        """checkpoint: str stores, None clears, UNCHANGED keeps; state: str stores, UNCHANGED
        keeps."""
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(
                thread, ThreadWrite(checkpoint="cp1", state="st1"), expected_version=0
            )
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=1)
            record = await store.load_thread(thread)
            assert (record.checkpoint, record.state) == ("cp1", "st1")
            await store.write(thread, ThreadWrite(checkpoint=None, state="st2"), expected_version=2)
            record = await store.load_thread(thread)
            assert (record.checkpoint, record.state) == (None, "st2")

    async def test_bad_arguments_are_refused_before_anything(
        self, make_store: StoreFactory
    ) -> None:
        """Non-str documents, a negative version, an empty id: TypeError/ValueError, no write."""
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0)
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

    async def test_list_threads_sorted_with_prefix_and_limit(
        self, make_store: StoreFactory
    ) -> None:
        """Written threads are listed in order; a lease alone does not list a thread."""
        prefix = fresh_id("user")
        names = [f"{prefix}/b", f"{prefix}/a", f"{prefix}/c", f"{prefix}x/d"]
        async with opened(make_store) as store:
            for name in names:
                await store.write(name, ThreadWrite(docs_of("m")), expected_version=0)
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
        thread = fresh_id()
        async with opened(make_store) as store:
            lease = await store.acquire_lease(thread, "w", 60)
            await store.write(
                thread,
                ThreadWrite(docs_of("a", "b", "c"), checkpoint="cp", state="st"),
                expected_version=0,
                lease=lease,
            )
            await store.write(
                thread,
                ThreadWrite(compaction=Compaction(0, 2, docs_of("s"))),
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
            assert await store.write(thread, ThreadWrite(docs_of("new")), expected_version=0) == 1
            lease_only = fresh_id()
            await store.acquire_lease(lease_only, "w", 60)
            assert await store.delete_thread(lease_only) is True
            assert (await store.load_thread(lease_only)).lease is None

    # -- archive retention ----------------------------------------------------------------

    async def test_archive_is_oldest_first_and_kept_without_retention(
        self, make_store: StoreFactory
    ) -> None:
        """Several compactions are archived in order with the versions they produced."""
        thread = fresh_id()
        async with opened(make_store) as store:
            await store.write(thread, ThreadWrite(docs_of("a", "b", "c", "d")), expected_version=0)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, docs_of("s1"))), expected_version=1
            )
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, docs_of("s2"))), expected_version=2
            )
            archived = await store.archived(thread)
            assert [(a.version, texts_of(a.messages)) for a in archived] == [
                (2, ["a", "b"]),
                (3, ["s1", "c"]),
            ]

    async def test_retention_drops_old_archives(self, make_store: StoreFactory) -> None:
        """With archive_retention, ranges older than it are no longer returned (a second of
        retention: a loaded machine may take a tenth of one between a write and a read)."""
        thread = fresh_id()
        async with opened(make_store, archive_retention=1.0) as store:
            await store.write(thread, ThreadWrite(docs_of("a", "b", "c")), expected_version=0)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 2, docs_of("s"))), expected_version=1
            )
            await anyio.sleep(1.1)
            await store.write(
                thread, ThreadWrite(compaction=Compaction(0, 1, docs_of("t"))), expected_version=2
            )
            archived = await store.archived(thread)
            assert [(a.version, texts_of(a.messages)) for a in archived] == [(3, ["s"])]
            await anyio.sleep(1.1)
            assert await store.archived(thread) == []
            assert texts_of((await store.load_thread(thread)).messages) == ["t", "c"]
