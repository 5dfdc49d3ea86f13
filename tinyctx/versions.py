"""A thread's versions, and the thread as it was at one of them (time travel).

Every committed write makes a version. A store implementing :class:`ThreadVersionStore`
keeps a small record of each (:class:`ThreadVersion`: when, how many messages it appended,
which range a compaction replaced and by how many), beside the archive of what
compactions replaced. From those, :func:`load_as_of` rebuilds the live log exactly as a
reader saw it at an earlier version: it undoes the later writes from the current log,
newest first (drop what each appended, put back the originals its compaction archived).

A version is out of reach when the thread was written before its store recorded versions
(an upgraded store), or when a compaction after it has left the archive (the store's
``archive_retention``): :class:`VersionUnavailable` says which.

Run from an old version by forking it (``fork_thread(..., at_version=v)`` in
:mod:`tinyctx.forks`) or by rewinding the thread to it (``rewind_to_version``): both
keep the later writes (the source thread, or the archive).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from attrs import frozen

from .documents import SplitDocuments, split_document
from .errors import TinyCtxError
from .lifecycle import ThreadWindow, ThreadWindowStore
from .threads import ThreadRecord, ThreadStore, check_thread_id

T = TypeVar("T")

__all__ = [
    "ThreadVersion",
    "ThreadVersionStore",
    "ThreadAsOf",
    "VersionUnavailable",
    "load_as_of",
    "undo_writes",
]


@frozen
class ThreadVersion:
    """What the write that made ``version`` did: at ``written_at`` (seconds since the
    epoch) it appended ``appended`` messages, after replacing ``[start, end)`` with
    ``replaced`` messages when ``start`` is not None (a compaction or a rewind)."""

    version: int
    written_at: float
    appended: int
    start: int | None = None
    end: int | None = None
    replaced: int = 0


@runtime_checkable
class ThreadVersionStore(Protocol):
    """A thread store that records what each write did (see the module docstring)."""

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """The recorded versions of the thread, oldest first (empty for an unknown
        thread); versions written before the store recorded them are missing."""
        ...


@frozen
class ThreadAsOf:
    """The live log of a thread as it was at ``version`` (encoded documents)."""

    thread_id: str
    version: int
    messages: Sequence[str]
    """The documents (a :class:`~tinyctx.documents.SplitDocuments` where the store keeps
    them split; it reads as the same documents)."""


class VersionUnavailable(TinyCtxError, LookupError):
    """The thread cannot be rebuilt as of ``version`` (``reason`` says why)."""

    def __init__(self, thread_id: str, version: int, reason: str) -> None:
        self.thread_id = thread_id
        self.version = version
        self.reason = reason
        super().__init__(f"thread {thread_id!r} cannot be read as of version {version}: {reason}")


def undo_writes(
    thread_id: str,
    current: Sequence[T],
    current_version: int,
    version: int,
    log: Sequence[ThreadVersion],
    originals: Mapping[int, tuple[T, ...]],
) -> list[T]:
    """The live log at ``version``, from the log at ``current_version`` and the records
    (``log``) and archived originals (by version) of the writes in between (documents,
    or any item standing for one)."""
    by_version = {entry.version: entry for entry in log}
    docs = list(current)
    for number in range(current_version, version, -1):
        entry = by_version.get(number)
        if entry is None:
            raise VersionUnavailable(
                thread_id,
                version,
                f"version {number} was written before the store recorded versions",
            )
        if entry.appended:
            del docs[len(docs) - entry.appended :]
        if entry.start is not None:
            assert entry.end is not None
            put_back: tuple[T, ...] = ()
            if entry.end > entry.start:
                found = originals.get(number)
                if found is None:
                    raise VersionUnavailable(
                        thread_id,
                        version,
                        f"the originals version {number} compacted left the archive "
                        "(archive_retention)",
                    )
                put_back = found
            docs[entry.start : entry.start + entry.replaced] = put_back
    return docs


async def load_as_of(store: ThreadStore, thread_id: str, version: int) -> ThreadAsOf:
    """The thread's live log as it was at ``version`` (0: empty; the current version:
    as it is). Each read is of data that never changes once written (or is checked
    against the version it was read at), so a write landing meanwhile changes nothing of
    the answer.

    A store that also reads windows (:class:`~tinyctx.lifecycle.ThreadWindowStore`)
    reads only the live messages that survive to ``version``: rebuilding an old version
    of a long thread costs the log of versions and the messages it holds, not a load of
    the whole thread.
    """
    check_thread_id(thread_id)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"load_as_of(version={version!r}): version must be an integer >= 0")
    if isinstance(store, ThreadWindowStore) and isinstance(store, ThreadVersionStore):
        for _ in range(_WINDOW_ATTEMPTS):
            found = await _as_of_by_window(store, thread_id, version)
            if found is not None:
                return found
    return await _as_of_by_load(store, thread_id, version)


_WINDOW_ATTEMPTS = 3
"""Window reads raced by writes before :func:`load_as_of` loads the whole thread."""


def _check_reachable(thread_id: str, version: int, current: int) -> None:
    if version > current:
        raise ValueError(
            f"load_as_of(version={version}): thread {thread_id!r} is at version {current}"
        )


async def _as_of_by_window(store: Any, thread_id: str, version: int) -> ThreadAsOf | None:
    """The log at ``version`` from the live messages that survive to it, read in one
    window; None when the current or the empty version is asked (a plain load answers)
    or a write landed between the reads (the caller tries again)."""
    head: ThreadWindow = await store.load_window(thread_id, count=0)
    _check_reachable(thread_id, version, head.version)
    if version in (0, head.version):
        return None
    current = head.version
    log = [v for v in await store.versions(thread_id) if version < v.version <= current]
    originals: dict[int, tuple[str, ...]] = {
        a.version: a.messages
        for a in await store.archived(thread_id)
        if version < a.version <= current
    }
    # undo the later writes on positions of the current log: what survives to `version`
    # stays an int (in increasing order), what came back from the archive is a document
    slots = undo_writes(
        thread_id, list[int | str](range(head.length)), current, version, log, originals
    )
    kept = [slot for slot in slots if isinstance(slot, int)]
    if not kept:
        return ThreadAsOf(thread_id, version, tuple(str(slot) for slot in slots))
    low, high = kept[0], kept[-1] + 1
    if high - low > head.length // 4:
        # much of the log survives: the whole load keeps documents split, which decode
        # faster than the window's joined ones
        record = await store.load_thread(thread_id)
        if record.version != current:
            return None
        return _rebuild(thread_id, record, version, log, originals)
    window: ThreadWindow = await store.load_window(thread_id, stop=high, count=high - low)
    if window.version != current or window.start != low:
        return None
    live = window.messages
    docs = tuple(live[slot - low] if isinstance(slot, int) else slot for slot in slots)
    return ThreadAsOf(thread_id, version, docs)


async def _as_of_by_load(store: ThreadStore, thread_id: str, version: int) -> ThreadAsOf:
    """The log at ``version`` from the whole current log (any :class:`ThreadStore`)."""
    record = await store.load_thread(thread_id)
    _check_reachable(thread_id, version, record.version)
    if version == record.version:
        return ThreadAsOf(thread_id, version, tuple(record.messages))
    if version == 0:
        return ThreadAsOf(thread_id, 0, ())
    if not isinstance(store, ThreadVersionStore):
        raise VersionUnavailable(
            thread_id, version, f"{type(store).__name__} does not record versions"
        )
    log = [v for v in await store.versions(thread_id) if version < v.version <= record.version]
    originals = {
        a.version: a.messages
        for a in await store.archived(thread_id)
        if version < a.version <= record.version
    }
    return _rebuild(thread_id, record, version, log, originals)


def _rebuild(
    thread_id: str,
    record: ThreadRecord,
    version: int,
    log: Sequence[ThreadVersion],
    originals: dict[int, tuple[str, ...]],
) -> ThreadAsOf:
    """``record``'s log undone back to ``version``."""
    current = record.messages
    if type(current) is SplitDocuments:
        # rows stay split (head, text): decode_messages reads them without joining
        split = {v: tuple(split_document(doc) for doc in docs) for v, docs in originals.items()}
        rows = undo_writes(thread_id, current.rows, record.version, version, log, split)
        return ThreadAsOf(thread_id, version, SplitDocuments(rows))
    docs = undo_writes(thread_id, current, record.version, version, log, originals)
    return ThreadAsOf(thread_id, version, tuple(docs))
