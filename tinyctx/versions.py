"""A thread's versions, and the thread as it was at one of them (time travel).

Every committed write makes a version. A store implementing :class:`ThreadVersionStore`
keeps a small record of each (:class:`ThreadVersion`: when, how many messages it appended,
which range a compaction replaced and by how many), beside the archive of what
compactions replaced. From those, :func:`load_as_of` rebuilds the live log exactly as a
reader saw it at an earlier version: it undoes the later writes from the current log,
newest first (drop what each appended, put back the originals its compaction archived).

**Layer state and checkpoint as of a version.** A store implementing
:class:`ThreadLayersStore` (every built-in one) keeps, beside each version's record, the
layer state and the checkpoint that write set (or cleared): only writes that changed
them store a copy, and :meth:`ThreadLayersStore.layers_as_of` answers with the newest
at or before the version, so :attr:`ThreadAsOf.state` and :attr:`ThreadAsOf.checkpoint`
are what a reader loading the thread at that version saw. The copies are kept as long as
the thread's version records (until it is deleted or expires): one per write that
changed the state (a session's run writes it once, at its end, with its usage record) or
the checkpoint (a pause, and the write that goes on from it). For a version written
before the store kept them (an upgraded store), both are those of the newest kept write
before it (None when none was kept); a store without the protocol gives None for both.

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
    "ThreadLayersStore",
    "ThreadAsOf",
    "VersionUnavailable",
    "load_as_of",
    "undo_writes",
    "layers_at",
]


@frozen
class ThreadVersion:
    """What the write that made ``version`` did: at ``written_at`` (seconds since the
    epoch) it appended ``appended`` messages, after replacing ``[start, end)`` with
    ``replaced`` messages when ``start`` is not None (a compaction or a rewind).
    ``run_id`` names the run that wrote it (the id its usage is recorded under,
    :mod:`tinyctx.thread_usage`); None for a write outside a run (a fork, a rewind)
    or one recorded before the store kept run ids."""

    version: int
    written_at: float
    appended: int
    start: int | None = None
    end: int | None = None
    replaced: int = 0
    run_id: str | None = None


@runtime_checkable
class ThreadVersionStore(Protocol):
    """A thread store that records what each write did (see the module docstring)."""

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """The recorded versions of the thread, oldest first (empty for an unknown
        thread); versions written before the store recorded them are missing."""
        ...


@runtime_checkable
class ThreadLayersStore(Protocol):
    """A thread store that keeps the layer state and checkpoint each write set."""

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        """The ``(checkpoint, state)`` documents the thread had at ``version``: those of
        the newest write at or before it that set them (None: none did, or cleared)."""
        ...


@frozen
class ThreadAsOf:
    """The thread as it was at ``version``: its live log (encoded documents), and its
    checkpoint and layer state then (see the module docstring for when they are None)."""

    thread_id: str
    version: int
    messages: Sequence[str]
    """The documents (a :class:`~tinyctx.documents.SplitDocuments` where the store keeps
    them split; it reads as the same documents)."""
    checkpoint: str | None = None
    state: str | None = None


class VersionUnavailable(TinyCtxError, LookupError):
    """The thread cannot be rebuilt as of ``version`` (``reason`` says why)."""

    def __init__(self, thread_id: str, version: int, reason: str) -> None:
        self.thread_id = thread_id
        self.version = version
        self.reason = reason
        super().__init__(f"thread {thread_id!r} cannot be read as of version {version}: {reason}")


def layers_at(
    kept: Sequence[tuple[int, bool, str | None, str | None]], version: int
) -> tuple[str | None, str | None]:
    """``(checkpoint, state)`` at ``version`` from the copies writes kept, oldest first:
    ``(version, checkpoint set, checkpoint, state or None when unchanged)``."""
    checkpoint: tuple[str | None] | None = None
    state: str | None = None
    for at, checkpoint_set, kept_checkpoint, kept_state in reversed(kept):
        if at > version:
            continue
        if checkpoint is None and checkpoint_set:
            checkpoint = (kept_checkpoint,)
        if state is None and kept_state is not None:
            state = kept_state
        if checkpoint is not None and state is not None:
            break
    return (None if checkpoint is None else checkpoint[0]), state


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
    found = None
    if isinstance(store, ThreadWindowStore) and isinstance(store, ThreadVersionStore):
        for _ in range(_WINDOW_ATTEMPTS):
            found = await _as_of_by_window(store, thread_id, version)
            if found is not None:
                break
    if found is None:
        found = await _as_of_by_load(store, thread_id, version)
    if found.version in (0, found.current) or not isinstance(store, ThreadLayersStore):
        return found.evolve()
    checkpoint, state = await store.layers_as_of(thread_id, version)
    return found.evolve(checkpoint=checkpoint, state=state)


@frozen
class _Found:
    """A log as of ``version`` and, when that is the version the read saw as current,
    the checkpoint and state read with it."""

    thread_id: str
    version: int
    current: int
    messages: Sequence[str]
    checkpoint: str | None = None
    state: str | None = None

    def evolve(self, **changes: str | None) -> ThreadAsOf:
        layers = {"checkpoint": self.checkpoint, "state": self.state, **changes}
        return ThreadAsOf(self.thread_id, self.version, self.messages, **layers)


_WINDOW_ATTEMPTS = 3
"""Window reads raced by writes before :func:`load_as_of` loads the whole thread."""


def _check_reachable(thread_id: str, version: int, current: int) -> None:
    if version > current:
        raise ValueError(
            f"load_as_of(version={version}): thread {thread_id!r} is at version {current}"
        )


async def _as_of_by_window(store: Any, thread_id: str, version: int) -> _Found | None:
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
        return _Found(thread_id, version, current, tuple(str(slot) for slot in slots))
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
    return _Found(thread_id, version, current, docs)


async def _as_of_by_load(store: ThreadStore, thread_id: str, version: int) -> _Found:
    """The log at ``version`` from the whole current log (any :class:`ThreadStore`)."""
    record = await store.load_thread(thread_id)
    _check_reachable(thread_id, version, record.version)
    if version == record.version:
        messages = tuple(record.messages)
        return _Found(thread_id, version, version, messages, record.checkpoint, record.state)
    if version == 0:
        return _Found(thread_id, 0, record.version, ())
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
) -> _Found:
    """``record``'s log undone back to ``version``."""
    current = record.messages
    if type(current) is SplitDocuments:
        # rows stay split (head, text): decode_messages reads them without joining
        split = {v: tuple(split_document(doc) for doc in docs) for v, docs in originals.items()}
        rows = undo_writes(thread_id, current.rows, record.version, version, log, split)
        return _Found(thread_id, version, record.version, SplitDocuments(rows))
    docs = undo_writes(thread_id, current, record.version, version, log, originals)
    return _Found(thread_id, version, record.version, tuple(docs))
