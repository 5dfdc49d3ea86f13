"""Optional store protocols for a thread's whole life, and the values they exchange.

A :class:`~tinyctx.threads.ThreadStore` keeps working without any of these; a store that
implements one gets the matching capability done cheaply (the built-in stores implement
all of them, and the conformance suite holds them to one behaviour):

- :class:`ThreadWindowStore`: read a slice of the live log (pages, usage without messages);
- :class:`ArchivePruneStore`: drop a thread's archived originals older than an age;
- :class:`ThreadExpiryStore`: a TTL per thread or per store (expired threads vanish);
- :class:`ThreadEraseStore`: erase a thread with its labels and thread notes at once.

**Expiry (TTL).** A thread's TTL is its own (:meth:`ThreadExpiryStore.set_thread_ttl`)
or else its store's ``ttl=``; ``None`` or ``math.inf`` never expires. It slides: the
clock starts again at every write of the thread (and at every TTL change), never at a
read or a lease renewal, so a thread expires ``ttl`` seconds after its last write. An
expired thread goes whole: its messages, archive, versions, checkpoint, layer state,
lease, labels (:data:`THREAD_METADATA`) and the notes of its namespaces (those of the
form ``"<prefix>:thread:<thread_id>"`` with no ``:thread:`` in ``<prefix>``, the
namespaces :class:`~tinyctx.middleware.SessionMemory` writes with ``scope="thread"``:
:func:`thread_of_namespace`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Protocol, runtime_checkable

from attrs import frozen

from .config import Check, number, optional
from .threads import check_thread_id

__all__ = [
    "ThreadWindow",
    "ThreadWindowStore",
    "ArchivePruneStore",
    "ThreadExpiryStore",
    "ThreadEraseStore",
    "THREAD_METADATA",
    "check_store_ttl",
    "check_thread_ttl",
    "expires_at",
    "thread_of_namespace",
    "check_window_args",
    "check_age",
    "window_of",
]


@frozen
class ThreadWindow:
    """Live messages ``[start, start + len(messages))`` of a thread, read in one snapshot.

    ``length`` is the live log's length and ``version`` the thread's version at that
    snapshot; ``checkpoint`` and ``state`` are the thread's documents then (read without
    any message when the window is empty).
    """

    thread_id: str
    version: int
    length: int
    start: int
    messages: tuple[str, ...]
    checkpoint: str | None = None
    state: str | None = None


@runtime_checkable
class ThreadWindowStore(Protocol):
    """A thread store that reads a slice of the live log without the rest of it."""

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` messages before index ``stop`` (None: the end of the log):
        the live messages ``[max(0, s - count), s)`` where ``s = min(stop, length)``.

        ``count=0`` reads the version, length, checkpoint and state alone. An unknown
        thread is an empty window at version 0.
        """
        ...


def check_window_args(thread_id: str, stop: int | None, count: int) -> None:
    """The argument checks of :meth:`ThreadWindowStore.load_window` (``ValueError`` naming
    the argument and what it may be)."""
    check_thread_id(thread_id)
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 0):
        raise ValueError(f"load_window(stop={stop!r}): stop must be None or an integer >= 0")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"load_window(count={count!r}): count must be an integer >= 0")


def window_of(
    thread_id: str,
    version: int,
    docs: Sequence[str],
    stop: int | None,
    count: int,
    checkpoint: str | None = None,
    state: str | None = None,
) -> ThreadWindow:
    """The window a whole log ``docs`` holds (what a store without a cheaper read does)."""
    length = len(docs)
    end = length if stop is None else min(stop, length)
    start = max(0, end - count)
    return ThreadWindow(
        thread_id, version, length, start, tuple(docs[start:end]), checkpoint, state
    )


@runtime_checkable
class ArchivePruneStore(Protocol):
    """A thread store that drops archived originals older than an age, on request (the
    application schedules it; ``archive_retention`` does it on every compaction)."""

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Remove the thread's archived ranges archived more than ``older_than`` seconds
        ago; how many were removed. Versions before them can no longer be rebuilt."""
        ...


def check_age(older_than: object) -> float:
    """``older_than`` as seconds >= 0, else ``ValueError`` naming it."""
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, (int, float))
        or not older_than >= 0
        or older_than == float("inf")
    ):
        raise ValueError(f"prune_archive(older_than={older_than!r}): seconds >= 0, finite")
    return float(older_than)


THREAD_METADATA: Final = "tinyctx.thread_metadata"
"""The key/value namespace holding each labelled thread's metadata (key: the thread id):
:func:`tinyctx.retention.set_thread_metadata`."""

_NOTES_OF_THREAD: Final = ":thread:"


def thread_of_namespace(namespace: str) -> str | None:
    """The thread whose notes ``namespace`` holds (``"<prefix>:thread:<id>"``, split at
    the first ``:thread:``), or None: such notes expire with their thread."""
    _, found, thread_id = namespace.partition(_NOTES_OF_THREAD)
    return thread_id if found and thread_id else None


_STORE_TTL: Final[Check[float | None]] = optional(
    number(above=0, finite=False), allowed="None (threads never expire) or seconds > 0"
)
_THREAD_TTL: Final[Check[float | None]] = optional(
    number(above=0, finite=False),
    allowed="None (the store's ttl applies), seconds > 0, or math.inf (never expires)",
)


def check_store_ttl(value: object, owner: str) -> float | None:
    """A store's ``ttl=``: None or seconds > 0 (``math.inf`` reads as None); a
    ConfigError naming ``owner`` otherwise."""
    checked = _STORE_TTL.check(value, "ttl", owner)
    return None if checked is None or math.isinf(checked) else float(checked)


def check_thread_ttl(value: object) -> float | None:
    """``set_thread_ttl``'s ``seconds``: None (the store's), seconds > 0 or ``math.inf``."""
    checked = _THREAD_TTL.check(value, "seconds", "set_thread_ttl")
    return None if checked is None else float(checked)


def expires_at(written_at: float, own: float | None, default: float | None) -> float:
    """When a thread last written at ``written_at`` expires (``math.inf``: never), from
    its own TTL (None: the store's ``default``)."""
    ttl = own if own is not None else default
    return math.inf if ttl is None else written_at + ttl


@runtime_checkable
class ThreadExpiryStore(Protocol):
    """A thread store whose threads expire (see the module docstring)."""

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        """Give the thread its own TTL (None: the store's; ``math.inf``: never), counted
        from now; False (nothing set) when no such thread exists."""
        ...

    async def sweep_expired(self) -> list[str]:
        """Remove every expired thread whole now; their ids, sorted. A store without
        native expiry (SQL, memory) needs it scheduled to free the space; its reads treat
        an expired thread as absent meanwhile."""
        ...


@runtime_checkable
class ThreadEraseStore(Protocol):
    """A thread store that erases a thread with everything that names it, as expiry does
    (:func:`tinyctx.retention.delete_threads_where` uses it to delete a user's data)."""

    async def erase_thread(self, thread_id: str) -> bool:
        """Remove the thread whole (messages, archive, versions, checkpoint, state,
        lease), its labels (:data:`THREAD_METADATA`) and the notes of its namespaces
        (:func:`thread_of_namespace`), in one transaction where the store has them;
        whether anything of it was there."""
        ...
