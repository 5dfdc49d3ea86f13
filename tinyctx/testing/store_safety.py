"""The parts of the store conformance suites about safety: closing, thread ids, messages.

:class:`StoreSafetyConformance` and :class:`ThreadSafetyConformance` are mixed into
:class:`~tinyctx.testing.store_conformance.StoreConformance` and
:class:`~tinyctx.testing.store_conformance.ThreadStoreConformance`, so a backend that
subclasses those (with its ``make_store`` fixture) is held to these contracts too:

- a closed store refuses every call with :class:`~tinyctx.StoreClosed`, and closing twice
  is fine;
- every store takes exactly the thread ids :func:`~tinyctx.threads.check_thread_id` takes
  (:data:`~tinyctx.threads.THREAD_ID_RULE`) and refuses the others, on every method, with
  :class:`~tinyctx.InvalidThreadId` naming ``thread_id`` and the rule, before it touches
  storage: no driver's ``UnicodeEncodeError`` or database limit ever shows through;
- a :class:`~tinyctx.LeaseHeld` says until when, as a time and as "in N s".
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .. import codec
from ..messages import UserMessage
from ..store_errors import StoreClosed
from ..threads import (
    THREAD_ID_MAX_LENGTH,
    InvalidThreadId,
    Lease,
    LeaseHeld,
    ThreadWrite,
)
from ._store_kit import store_property_settings

__all__ = ["StoreSafetyConformance", "ThreadSafetyConformance", "INVALID_THREAD_IDS"]


class _Factory(Protocol):
    def __call__(self, *, archive_retention: float | None = None) -> Awaitable[Any]: ...


_ids = itertools.count()


def _fresh(prefix: str = "safe") -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"


@asynccontextmanager
async def _opened(make_store: _Factory) -> AsyncIterator[Any]:
    store = await make_store()
    try:
        yield store
    finally:
        await store.aclose()


_PROPERTY = store_property_settings()

INVALID_THREAD_IDS: tuple[object, ...] = (
    "",
    "lone \udc80 surrogate",
    "\ud83e",  # half of a surrogate pair
    "nul \x00 inside",
    "tab\there",
    "new\nline",
    "\x7f",
    "c1 \x85 control",
    "x" * (THREAD_ID_MAX_LENGTH + 1),
    "y" * 1_000_000,
    5,
    None,
    b"bytes",
)
"""Thread ids every store refuses (empty, surrogates, control characters, too long, not a
str)."""

_VALID_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))
_INVALID_CHARS = st.characters(whitelist_categories=("Cs", "Cc"))


def _docs(*texts: str) -> tuple[str, ...]:
    return codec.encode_messages(UserMessage(text) for text in texts)


def _thread_calls(thread_id: Any) -> list[tuple[str, Callable[[Any], Awaitable[Any]]]]:
    """Every ThreadStore method, called with ``thread_id`` where it takes one."""
    lease = Lease(thread_id, "owner", 1, 0.0)
    return [
        ("load_thread", lambda s: s.load_thread(thread_id)),
        ("write", lambda s: s.write(thread_id, ThreadWrite(_docs("x")), expected_version=0)),
        ("acquire_lease", lambda s: s.acquire_lease(thread_id, "owner", 30)),
        ("renew_lease", lambda s: s.renew_lease(lease, 30)),
        ("release_lease", lambda s: s.release_lease(lease)),
        ("archived", lambda s: s.archived(thread_id)),
        ("delete_thread", lambda s: s.delete_thread(thread_id)),
        ("append_notes", lambda s: s.append_notes(_fresh("ns"), ["n"], fence=lease)),
    ]


@pytest.mark.anyio
class StoreSafetyConformance:
    """A closed Store refuses work."""

    async def test_a_closed_store_refuses_every_call(self, make_store: _Factory) -> None:
        """After aclose() (twice is fine) every Store call raises StoreClosed."""
        ns = _fresh("ns")
        store = await make_store()
        await store.put(ns, "k", 1)
        await store.aclose()
        await store.aclose()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.get(ns, "k"),
            lambda: store.put(ns, "k", 2),
            lambda: store.delete(ns, "k"),
            lambda: store.keys(ns),
            lambda: store.append_note(ns, "n"),
            lambda: store.notes(ns),
        ]
        for call in calls:
            with pytest.raises(StoreClosed, match="closed"):
                await call()


@pytest.mark.anyio
class ThreadSafetyConformance:
    """A closed ThreadStore refuses work; thread ids are checked alike everywhere; a busy
    thread says until when."""

    async def test_a_closed_thread_store_refuses_every_call(self, make_store: _Factory) -> None:
        """After aclose() every ThreadStore call raises StoreClosed, leases and lists too."""
        thread = _fresh()
        store = await make_store()
        await store.write(thread, ThreadWrite(_docs("a")), expected_version=0)
        await store.aclose()
        await store.aclose()
        for _name, call in _thread_calls(thread):
            with pytest.raises(StoreClosed):
                await call(store)
        with pytest.raises(StoreClosed):
            await store.list_threads()

    @pytest.mark.parametrize("thread_id", INVALID_THREAD_IDS, ids=lambda v: repr(v)[:24])
    async def test_an_invalid_thread_id_is_refused_by_every_method(
        self, make_store: _Factory, thread_id: object
    ) -> None:
        """Each method refuses the id with InvalidThreadId (a ValueError) naming thread_id and
        the rule, and nothing is stored."""
        async with _opened(make_store) as store:
            for name, call in _thread_calls(thread_id):
                with pytest.raises(InvalidThreadId, match=r"^thread_id=") as caught:
                    await call(store)
                assert isinstance(caught.value, ValueError), name
                assert f"1 to {THREAD_ID_MAX_LENGTH} characters" in str(caught.value), name
                assert len(str(caught.value)) < 600, name  # a 1 MB id is not echoed whole

    async def test_a_list_prefix_follows_the_same_rule(self, make_store: _Factory) -> None:
        """list_threads(prefix=...) refuses what no thread id can start with, naming prefix."""
        async with _opened(make_store) as store:
            for prefix in ("\udc80", "a\x00", "z" * (THREAD_ID_MAX_LENGTH + 1)):
                with pytest.raises(InvalidThreadId, match=r"^prefix="):
                    await store.list_threads(prefix=prefix)
            assert isinstance(await store.list_threads(prefix=""), list)

    async def test_the_longest_and_oddest_ids_work_everywhere(self, make_store: _Factory) -> None:
        """An id of the full length in 4-byte characters, and ids with the characters key
        layouts and SQL care about, are written, read, listed, leased and deleted."""
        base = _fresh()
        odd = [
            base + "🦀" * (THREAD_ID_MAX_LENGTH - len(base)),
            f"{base} {{t}}:m:x %s '\"; DROP TABLE threads; -- *?[]\\",
            f"{base}/\u00e9\u200b\U0010fffd\ufeff",
        ]
        async with _opened(make_store) as store:
            for thread in odd:
                assert len(thread) <= THREAD_ID_MAX_LENGTH
                lease = await store.acquire_lease(thread, "w", 30)
                await store.write(
                    thread, ThreadWrite(_docs(thread)), expected_version=0, lease=lease
                )
                record = await store.load_thread(thread)
                assert (record.thread_id, record.version) == (thread, 1)
                await store.renew_lease(lease, 30)
                await store.release_lease(lease)
            assert await store.list_threads(prefix=base) == sorted(odd)
            for thread in odd:
                assert await store.delete_thread(thread) is True

    @_PROPERTY
    @given(suffix=st.text(_VALID_CHARS, max_size=40))
    async def test_any_valid_thread_id_round_trips(self, make_store: _Factory, suffix: str) -> None:
        """Any id the rule allows is stored under itself and listed under its own prefix."""
        thread = _fresh() + suffix
        async with _opened(make_store) as store:
            await store.write(thread, ThreadWrite(_docs("m")), expected_version=0)
            assert (await store.load_thread(thread)).version == 1
            assert thread in await store.list_threads(prefix=thread)
            assert await store.delete_thread(thread) is True

    @_PROPERTY
    @given(
        head=st.text(_VALID_CHARS, max_size=10),
        bad=_INVALID_CHARS,
        tail=st.text(max_size=10),
    )
    async def test_any_control_character_or_surrogate_is_refused(
        self, make_store: _Factory, head: str, bad: str, tail: str
    ) -> None:
        """An id holding a control character or a surrogate anywhere is refused, naming it."""
        async with _opened(make_store) as store:
            with pytest.raises(InvalidThreadId, match=f"U\\+{ord(bad):04X} at index {len(head)}"):
                await store.load_thread(head + bad + tail)

    async def test_lease_held_says_until_when(self, make_store: _Factory) -> None:
        """LeaseHeld gives the expiry as a UTC time and as the seconds left, not an epoch."""
        thread = _fresh()
        async with _opened(make_store) as store:
            await store.acquire_lease(thread, "worker-a", 60)
            with pytest.raises(LeaseHeld) as caught:
                await store.acquire_lease(thread, "worker-b", 60)
            text = str(caught.value)
            assert re.search(r"until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(in \d+\.\d s\)", text)
            left = float(re.findall(r"\(in (\d+\.\d) s\)", text)[0])
            assert 0 < left <= 60.5
            await store.delete_thread(thread)
