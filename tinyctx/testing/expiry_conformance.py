"""Conformance cases for thread expiry (:class:`~tinyctx.lifecycle.ThreadExpiryStore`): a
TTL per store (``ttl=``) or per thread, sliding from the last write; an expired thread
reads as absent and goes whole (messages, archive, versions, checkpoint, state, lease,
labels and the notes of its namespaces), natively (Redis) or by ``sweep_expired``.

A base of :class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`; a store
without the protocol skips these cases. The "nothing left" checks use the backend suite's
``stored_traces`` (see :mod:`tinyctx.testing.retention_conformance`). Expiry is shown on
the stores' own clocks with short TTLs: each wait is polled with a bound, and a check that
needs the machine to be quick enough retries when it was not.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import pytest

from .. import codec
from ..errors import ConfigError
from ..lifecycle import ThreadExpiryStore
from ..retention import set_thread_metadata, set_thread_ttl, sweep_expired, thread_metadata
from ..store_protocols import Store
from ..threads import Compaction, StaleThreadVersion, ThreadWrite
from ..versions import ThreadVersionStore
from ._store_kit import StoreFactory, ThreadSuite, docs_of, fresh_id, opened, texts_of

__all__ = ["ThreadExpiryConformance"]

_BOUND = 10.0
"""How long a case waits for an expiry it expects before it fails."""


def _require_expiry(store: object) -> None:
    if not isinstance(store, ThreadExpiryStore) or not isinstance(store, Store):
        pytest.skip(f"{type(store).__name__} keeps no TTL")


async def _until_gone(store: Any, thread_id: str) -> None:
    """Wait (polling, bounded) until ``thread_id`` reads as absent."""
    with anyio.fail_after(_BOUND):
        while True:  # the store's clock, not an event: polled
            if not (await store.load_thread(thread_id)).version:
                return
            await anyio.sleep(0.05)


@pytest.mark.anyio
class ThreadExpiryConformance(ThreadSuite):
    """Threads expire by their TTL, sliding from the last write, and go whole."""

    async def stored_traces(self, store: Any, thread_id: str) -> list[str] | None:
        """Override: what the store's raw storage still holds naming ``thread_id``."""
        return None

    async def _expiring_thread(self, store: Any, thread_id: str) -> tuple[str, str]:
        """A thread with everything a thread can hold (messages, an archived compaction,
        versions, a checkpoint, layer state, a live lease, labels, notes of its own
        namespace); its notes namespace and an unrelated one."""
        await set_thread_metadata(store, thread_id, {"user_id": "u1"})
        lease = await store.acquire_lease(thread_id, "worker", 60)
        state = codec.encode_state({"memory": {"notes": 2}})
        change = ThreadWrite(docs_of("a", "b", "c"), checkpoint="cp", state=state)
        await store.write(thread_id, change, expected_version=0, lease=lease)
        compact = ThreadWrite(docs_of("d"), Compaction(0, 2, docs_of("sum")))
        await store.write(thread_id, compact, expected_version=1, lease=lease)
        own, unrelated = f"memory:thread:{thread_id}", f"memory:user:{fresh_id('u')}"
        await store.append_notes(own, ["fact one", "fact two"])
        await store.append_note(unrelated, "kept")
        return own, unrelated

    async def test_an_expired_thread_vanishes_whole(self, make_store: StoreFactory) -> None:
        """Past the store's TTL the thread, its archive, versions, checkpoint, state,
        lease, labels and its namespace's notes are gone (after a sweep where the store
        has no native expiry); a thread of its own TTL math.inf and other notes stay."""
        thread, kept = fresh_id("exp"), fresh_id("keep")
        async with opened(make_store, ttl=0.3) as store:
            _require_expiry(store)
            own, unrelated = await self._expiring_thread(store, thread)
            await store.write(kept, ThreadWrite(docs_of("x")), expected_version=0)
            assert await set_thread_ttl(store, kept, math.inf) is True
            await _until_gone(store, thread)
            assert await store.list_threads(prefix=thread) == []
            assert await store.archived(thread) == []
            if isinstance(store, ThreadVersionStore):
                assert await store.versions(thread) == []
            swept = await sweep_expired(store)
            assert set(swept) <= {thread}
            record = await store.load_thread(thread)
            assert (record.version, tuple(record.messages)) == (0, ())
            assert (record.checkpoint, record.state, record.lease) == (None, None, None)
            assert await thread_metadata(store, thread) == {}
            assert await store.notes(own) == []
            assert [n.text for n in await store.notes(unrelated)] == ["kept"]
            assert await self.stored_traces(store, thread) in (None, [])
            assert texts_of((await store.load_thread(kept)).messages) == ["x"]
            assert await sweep_expired(store) == []

    async def test_writes_slide_the_expiry(self, make_store: StoreFactory) -> None:
        """A thread lives ttl seconds after its *last* write: written, then written again
        before its TTL ran out, it is there past the first write's expiry."""
        ttl = 1.0
        async with opened(make_store, ttl=ttl) as store:
            _require_expiry(store)
            for _ in range(5):  # a machine too slow to show it tries again
                thread = fresh_id("slide")
                await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0)
                first_done = time.monotonic()
                await anyio.sleep(ttl / 2)
                second_start = time.monotonic()
                try:
                    await store.write(thread, ThreadWrite(docs_of("b")), expected_version=1)
                except StaleThreadVersion:  # stalled past the first TTL: expired already
                    continue
                await anyio.sleep(first_done + ttl + 0.05 - time.monotonic())
                record = await store.load_thread(thread)
                if time.monotonic() - second_start < ttl:
                    assert texts_of(record.messages) == ["a", "b"]
                    break
            else:
                pytest.fail("the machine was too slow five times to show the sliding TTL")
            await _until_gone(store, thread)

    async def test_a_thread_ttl_overrides_the_store(self, make_store: StoreFactory) -> None:
        """set_thread_ttl gives one thread its own TTL (counted from now), None returns it
        to the store's, and an unknown thread is refused (False); bad values are a
        ConfigError naming the allowed ones."""
        short, forever = fresh_id("own"), fresh_id("forever")
        async with opened(make_store) as store:
            _require_expiry(store)
            for thread in (short, forever):
                await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0)
            assert await set_thread_ttl(store, short, 0.2) is True
            assert await set_thread_ttl(store, fresh_id("none"), 5) is False
            await _until_gone(store, short)
            assert await set_thread_ttl(store, short, 5) is False
            assert await set_thread_ttl(store, forever, 0.2) is True
            assert await set_thread_ttl(store, forever, None) is True  # the store's: none
            await anyio.sleep(0.4)
            assert texts_of((await store.load_thread(forever)).messages) == ["a"]
            for bad in (0, -1, "1h", True, float("nan")):
                with pytest.raises(ConfigError, match="seconds"):
                    await set_thread_ttl(store, forever, bad)  # type: ignore[arg-type]

    async def test_an_expired_thread_starts_again_empty(self, make_store: StoreFactory) -> None:
        """Once expired, a writer that saw the old thread is refused as stale, a new
        first write starts the thread from nothing, and its lease is taken afresh."""
        thread = fresh_id("again")
        async with opened(make_store, ttl=0.3) as store:
            _require_expiry(store)
            await store.write(thread, ThreadWrite(docs_of("old")), expected_version=0)
            await store.write(thread, ThreadWrite(docs_of("older")), expected_version=1)
            await _until_gone(store, thread)
            with pytest.raises(StaleThreadVersion):
                await store.write(thread, ThreadWrite(docs_of("late")), expected_version=2)
            lease = await store.acquire_lease(thread, "new-owner", 30)
            await store.write(thread, ThreadWrite(docs_of("new")), expected_version=0, lease=lease)
            record = await store.load_thread(thread)
            assert (record.version, texts_of(record.messages)) == (1, ["new"])
            assert await store.archived(thread) == []

    async def test_a_bad_store_ttl_is_a_config_error(self, make_store: StoreFactory) -> None:
        """ttl= on the store is None or seconds > 0, refused at construction otherwise."""
        async with opened(make_store) as store:
            _require_expiry(store)
        bad_values: tuple[Any, ...] = (0, -5, "1d", True)
        for bad in bad_values:
            with pytest.raises(ConfigError, match="ttl"):
                await make_store(ttl=bad)

    async def test_an_expiring_thread_deleted_early_leaves_nothing(
        self, make_store: StoreFactory
    ) -> None:
        """delete_thread on a thread with a TTL removes it at once: not listed, and
        nothing of it left in the store's storage."""
        thread = fresh_id("early")
        async with opened(make_store, ttl=60) as store:
            _require_expiry(store)
            await store.write(thread, ThreadWrite(docs_of("a")), expected_version=0)
            assert await store.list_threads(prefix=thread) == [thread]
            assert await store.delete_thread(thread) is True
            assert await store.list_threads(prefix=thread) == []
            assert await self.stored_traces(store, thread) in (None, [])
