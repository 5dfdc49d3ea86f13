"""Conformance cases for leases: fencing tokens, renewal and release, expiry and
take-over, and fenced note appends; a base of
:class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ..errors import SessionBusy
from ..messages import valid_text
from ..store_protocols import append_notes
from ..threads import Compaction, FencedOut, LeaseHeld, ThreadWrite
from ._store_kit import PROPERTY, StoreFactory, ThreadSuite, docs_of, fresh_id, opened, texts_of
from .strategies import texts

__all__ = ["ThreadLeaseConformance"]


@pytest.mark.anyio
class ThreadLeaseConformance(ThreadSuite):
    """The lease contract: one live owner, newer tokens fence older ones out."""

    # -- leases --------------------------------------------------------------------------

    async def test_a_live_lease_refuses_another_owner(self, make_store: StoreFactory) -> None:
        """LeaseHeld (a SessionBusy) names the thread and the owner holding it."""
        thread = fresh_id()
        async with opened(make_store) as store:
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
        thread = fresh_id()
        async with opened(make_store) as store:
            old = await store.acquire_lease(thread, "w", 60)
            new = await store.acquire_lease(thread, "w", 60)
            assert new.token > old.token
            with pytest.raises(FencedOut) as info:
                await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0, lease=old)
            assert (info.value.token, info.value.current) == (old.token, new.token)
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0, lease=new)
            assert (await store.load_thread(thread)).version == 1

    async def test_tokens_increase_across_threads_and_survive_delete(
        self, make_store: StoreFactory
    ) -> None:
        """Fencing tokens are strictly increasing over every lease the store grants."""
        threads = [fresh_id() for _ in range(3)]
        async with opened(make_store) as store:
            tokens = []
            for thread in threads * 2:
                lease = await store.acquire_lease(thread, "w", 60)
                tokens.append(lease.token)
                await store.write(
                    thread, ThreadWrite(docs_of("x")), expected_version=0, lease=lease
                )
                await store.delete_thread(thread)
            assert tokens == sorted(tokens)
            assert len(set(tokens)) == len(tokens)

    async def test_a_fenced_out_writer_applies_nothing(self, make_store: StoreFactory) -> None:
        """Under a replaced lease, no part of a write (compaction, append, checkpoint, state)
        lands."""
        thread = fresh_id()
        async with opened(make_store) as store:
            first = await store.acquire_lease(thread, "a", 60)
            await store.write(
                thread, ThreadWrite(docs_of("a", "b")), expected_version=0, lease=first
            )
            await store.release_lease(first)
            second = await store.acquire_lease(thread, "b", 60)
            before = await store.load_thread(thread)
            change = ThreadWrite(
                docs_of("late"), Compaction(0, 2, docs_of("sum")), checkpoint="cp", state="st"
            )
            with pytest.raises(FencedOut):
                await store.write(thread, change, expected_version=1, lease=first)
            assert await store.load_thread(thread) == before
            assert await store.archived(thread) == []
            assert before.lease == second

    async def test_a_fenced_out_note_append_writes_nothing(self, make_store: StoreFactory) -> None:
        """A note batch fenced by a replaced or released lease is refused whole (FencedOut,
        no note, no seq used); under the thread's newest lease it is appended."""
        thread, ns = fresh_id(), fresh_id("ns")
        async with opened(make_store) as store:
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

    @PROPERTY
    @given(batches=st.lists(st.lists(texts(40), min_size=1, max_size=4), min_size=1, max_size=4))
    async def test_only_the_newest_lease_appends_notes(
        self, make_store: StoreFactory, batches: list[list[str]]
    ) -> None:
        """Batches alternately fenced by a stale and the newest lease: exactly the newest
        lease's batches are stored, in order, with consecutive seqs."""
        thread, ns = fresh_id(), fresh_id("ns")
        async with opened(make_store) as store:
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
        thread = fresh_id()
        async with opened(make_store) as store:
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
        thread = fresh_id()
        async with opened(make_store) as store:
            dead = await store.acquire_lease(thread, "killed-worker", 0.05)
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0, lease=dead)
            await anyio.sleep(0.2)
            record = await store.load_thread(thread)
            assert record.lease == dead  # kept, expired, until someone takes over
            taken = await store.acquire_lease(thread, "new-worker", 60)
            assert taken.token > dead.token
            with pytest.raises(FencedOut):
                await store.write(thread, ThreadWrite(docs_of("b")), expected_version=1, lease=dead)
            with pytest.raises(FencedOut):
                await store.renew_lease(dead, 60)
            await store.write(thread, ThreadWrite(docs_of("b")), expected_version=1, lease=taken)
            assert texts_of((await store.load_thread(thread)).messages) == ["a", "b"]

    # -- list and delete -----------------------------------------------------------------
