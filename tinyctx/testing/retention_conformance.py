"""Conformance cases for erasing a user's data: :func:`tinyctx.retention.delete_threads_where`
deletes every thread labelled with a key and value, with the notes of its thread
namespaces (what ``SessionMemory(scope="thread")`` writes), and nothing of such a thread
is left in the store's own storage; a base of
:class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`.

A backend suite shows the "nothing left" part by overriding :meth:`stored_traces`: what
the store's raw storage (tables, keys) still holds that names a thread. Without the
override the cases check what the store's own methods report.
"""

from __future__ import annotations

from typing import Any

import pytest

from .. import codec
from ..forks import fork_thread
from ..retention import delete_threads_where, erase_thread, set_thread_metadata, thread_metadata
from ..store_protocols import Store
from ..threads import Compaction, ThreadWrite
from ..versions import ThreadVersionStore
from ._store_kit import StoreFactory, ThreadSuite, docs_of, fresh_id, opened

__all__ = ["ThreadRetentionConformance"]


def _require_labels(store: object) -> None:
    if not isinstance(store, Store):
        pytest.skip(f"{type(store).__name__} keeps no key/value data for labels")


@pytest.mark.anyio
class ThreadRetentionConformance(ThreadSuite):
    """Deleting by a label removes those threads whole and leaves every other thread."""

    async def stored_traces(self, store: Any, thread_id: str) -> list[str] | None:
        """Override: every row or key of ``store``'s raw storage naming ``thread_id``
        (None: the backend suite does not look into its storage)."""
        return None

    async def _full_thread(self, store: Any, thread_id: str, user: str) -> None:
        """A labelled thread with everything a thread can hold: messages, an archived
        compaction, versions, a checkpoint, layer state, a live lease and the notes of its
        thread namespaces (as SessionMemory writes them, one fenced by the lease)."""
        await set_thread_metadata(store, thread_id, {"user_id": user, "plan": "pro"})
        lease = await store.acquire_lease(thread_id, "worker", 60)
        state = codec.encode_state({"memory": {"notes": 2}})
        change = ThreadWrite(docs_of("a", "b", "c"), checkpoint="cp", state=state)
        await store.write(thread_id, change, expected_version=0, lease=lease)
        compact = ThreadWrite(docs_of("d"), Compaction(0, 2, docs_of("sum")))
        await store.write(thread_id, compact, expected_version=1, lease=lease)
        await store.append_notes(f"mem:thread:{thread_id}", ["likes tea", "lives in Oslo"])
        await store.append_notes(f"facts:thread:{thread_id}", ["fenced"], fence=lease)

    async def test_delete_by_label_leaves_nothing_of_those_threads(
        self, make_store: StoreFactory
    ) -> None:
        """Every thread labelled user_id=u1 (a fork of one too) goes with its archive,
        versions, checkpoint, state, lease and label; u2's thread stays whole."""
        first, second, fork, other = (fresh_id("del") for _ in range(4))
        shared = f"mem:global:{fresh_id('g')}"
        async with opened(make_store) as store:
            _require_labels(store)
            await self._full_thread(store, first, "u1")
            await self._full_thread(store, second, "u1")
            await self._full_thread(store, other, "u2")
            await store.append_note(shared, "everyone's")
            await fork_thread(store, first, new_id=fork)
            assert (await thread_metadata(store, fork))["user_id"] == "u1"
            kept_before = await store.load_thread(other)
            gone = await delete_threads_where(store, "user_id", "u1")
            assert gone == sorted([first, second, fork])
            for thread_id in gone:
                record = await store.load_thread(thread_id)
                assert (record.version, tuple(record.messages)) == (0, ())
                assert (record.checkpoint, record.state, record.lease) == (None, None, None)
                assert await store.archived(thread_id) == []
                if isinstance(store, ThreadVersionStore):
                    assert await store.versions(thread_id) == []
                assert await thread_metadata(store, thread_id) == {}
                assert await store.list_threads(prefix=thread_id) == []
                assert await store.notes(f"mem:thread:{thread_id}") == []
                assert await store.notes(f"facts:thread:{thread_id}") == []
                assert await self.stored_traces(store, thread_id) in (None, [])
            assert await store.load_thread(other) == kept_before
            assert len(await store.archived(other)) == 1
            assert (await thread_metadata(store, other))["user_id"] == "u2"
            assert [n.text for n in await store.notes(f"mem:thread:{other}")] == [
                "likes tea",
                "lives in Oslo",
            ]
            assert [n.text for n in await store.notes(shared)] == ["everyone's"]
            traces = await self.stored_traces(store, other)
            assert traces is None or traces  # the override sees a thread that is there
            assert await delete_threads_where(store, "user_id", "u1") == []

    async def test_labels_are_replaced_and_removed(self, make_store: StoreFactory) -> None:
        """set_thread_metadata replaces a thread's labels; an empty mapping removes them,
        so the thread is no longer found by its old label."""
        thread = fresh_id("lbl")
        async with opened(make_store) as store:
            _require_labels(store)
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0)
            await set_thread_metadata(store, thread, {"user_id": "old"})
            await set_thread_metadata(store, thread, {"user_id": "new"})
            assert await delete_threads_where(store, "user_id", "old") == []
            await set_thread_metadata(store, thread, {})
            assert await thread_metadata(store, thread) == {}
            assert await delete_threads_where(store, "user_id", "new") == []
            assert (await store.load_thread(thread)).version == 1
            with pytest.raises(TypeError, match="str keys"):
                await set_thread_metadata(store, thread, {1: "x"})  # type: ignore[dict-item]

    async def test_erase_takes_only_what_is_the_threads(self, make_store: StoreFactory) -> None:
        """erase_thread removes a thread's labels and thread notes even with no messages
        written (True), finds nothing the second time (False), and keeps the notes of a
        namespace that only names the thread past its first ':thread:' (another's)."""
        thread = fresh_id("erase")
        others = (f"mem:thread:x:thread:{thread}", f"mem:thread:{thread}x", f"mem:{thread}")
        async with opened(make_store) as store:
            _require_labels(store)
            await set_thread_metadata(store, thread, {"user_id": "u1"})
            await store.append_notes(f"mem:thread:{thread}", ["own"])
            for namespace in others:
                await store.append_note(namespace, "kept")
            assert await erase_thread(store, thread) is True
            assert await thread_metadata(store, thread) == {}
            assert await store.notes(f"mem:thread:{thread}") == []
            for namespace in others:
                assert [n.text for n in await store.notes(namespace)] == ["kept"]
            assert await erase_thread(store, thread) is False
            await store.append_note(f"mem:thread:{thread}", "again")  # a new start
            assert [n.seq for n in await store.notes(f"mem:thread:{thread}")] == [1]
