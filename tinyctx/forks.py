"""Fork a thread to a new id, or rewind it to an earlier point, on any ThreadStore.

``await fork_thread(store, "t-1", new_id="t-1-b")`` copies the thread's live history and
(``state=True``) its layers' per-thread state to a new thread, and the notes of the
namespaces given in ``notes`` (source namespace to target namespace). The new thread
shares nothing mutable with its source: a store keeps documents by value, so a write to
either never shows in the other. The fork has no paused run (a checkpoint names its
thread) and starts its own usage record (:mod:`tinyctx.thread_usage`). A ``new_id``
that holds a thread already is refused, never overwritten.

``fork_thread(..., at_version=v)`` forks the thread as it was at version ``v`` (its
history and the layer state it had then), and ``rewind_to_version(store, "t-1", v)``
makes that history and layer state current again (the replaced log is archived); both
need a store that records versions (:mod:`tinyctx.versions`).

``await rewind(store, "t-1", to_message=12)`` makes the first 12 live messages the whole
history again: the later ones are not deleted but archived, as a compaction of
``[12, length)`` with nothing in its place (``store.archived()`` shows them, within the
store's archive retention). The cut must not separate a tool call from its results, and
a paused run is dropped with the messages it was paused on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .codec import decode_messages, decode_state, encode_state
from .errors import TinyCtxError
from .frozen import thaw
from .messages import pending_tool_calls
from .retention import set_thread_metadata, thread_metadata
from .store_protocols import Store
from .thread_usage import USAGE_KEY
from .threads import (
    UNCHANGED,
    Compaction,
    Lease,
    StaleThreadVersion,
    ThreadStore,
    ThreadWrite,
    Unchanged,
    check_thread_id,
)
from .versions import load_as_of

__all__ = ["ThreadExists", "fork_thread", "rewind", "rewind_to_version"]


class ThreadExists(TinyCtxError, ValueError):
    """``fork_thread(new_id=...)`` names a thread that holds data already; nothing written."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"new_id={thread_id!r} holds a thread already: a fork never overwrites one "
            "(delete_thread() it first, or choose another id)"
        )


def _forked_state(state: str | None) -> str | Unchanged:
    if state is None:
        return UNCHANGED
    layers = dict(decode_state(state))
    layers.pop(USAGE_KEY, None)  # the fork's own runs are counted from zero
    return encode_state(thaw(layers)) if layers else UNCHANGED


async def fork_thread(
    store: ThreadStore,
    source: str,
    *,
    new_id: str,
    at_version: int | None = None,
    state: bool = True,
    notes: Mapping[str, str] | None = None,
) -> int:
    """Copy thread ``source`` to ``new_id`` (see the module docstring); returns the new
    thread's version (1). ``at_version`` forks the thread as it was at that version
    (:func:`tinyctx.versions.load_as_of`): its history and (``state=True``) the layer
    state it had then, so a run on the fork goes on from there."""
    check_thread_id(source)
    check_thread_id(new_id, field="new_id")
    if new_id == source:
        raise ValueError(f"new_id={new_id!r} is the source thread: a fork needs another id")
    if notes is not None and not isinstance(notes, Mapping):
        raise TypeError(f"notes must be a mapping of source to target namespace, got {notes!r}")
    if notes and not isinstance(store, Store):
        raise TypeError(f"notes=: {type(store).__name__} is not a Store, it keeps no notes")
    record = await store.load_thread(source)
    if record.version == 0:
        raise ValueError(f"source={source!r}: no such thread (never written)")
    messages, layers = tuple(record.messages), record.state
    if at_version is not None and at_version != record.version:
        old = await load_as_of(store, source, at_version)
        messages, layers = tuple(old.messages), old.state
    change = ThreadWrite(append=messages, state=_forked_state(layers) if state else UNCHANGED)
    try:
        version = await store.write(new_id, change, expected_version=0)
    except StaleThreadVersion:
        raise ThreadExists(new_id) from None
    if isinstance(store, Store):
        labels = await thread_metadata(store, source)
        if labels:  # a user's fork is that user's data too (delete_threads_where)
            await set_thread_metadata(store, new_id, labels)
    if notes:
        assert isinstance(store, Store)
        await _copy_notes(store, notes)
    return version


async def _copy_notes(store: Any, notes: Mapping[str, str]) -> None:
    for origin, target in notes.items():
        for note in await store.notes(origin):
            await store.append_note(target, note.text, metadata=thaw(note.metadata))


async def rewind(
    store: ThreadStore, thread_id: str, *, to_message: int, lease: Lease | None = None
) -> int:
    """Keep the first ``to_message`` live messages; archive the rest (see the module
    docstring). Returns the new version; ``StaleThreadVersion`` when a writer got there
    first, ``FencedOut`` under a lease that was replaced."""
    check_thread_id(thread_id)
    if isinstance(to_message, bool) or not isinstance(to_message, int) or to_message < 0:
        raise ValueError(f"to_message={to_message!r}: must be an integer >= 0")
    record = await store.load_thread(thread_id)
    length = len(record.messages)
    if to_message > length:
        raise ValueError(
            f"to_message={to_message} is past the end of thread {thread_id!r} "
            f"({length} live messages)"
        )
    kept = decode_messages(record.messages[:to_message], path="thread")
    open_calls = pending_tool_calls(kept)
    if open_calls:
        raise ValueError(
            f"to_message={to_message} would cut tool call {open_calls[0].id!r} from its "
            "result: rewind to before its assistant message or after its results"
        )
    change = ThreadWrite(compaction=Compaction(to_message, length, ()), checkpoint=None)
    return await store.write(thread_id, change, expected_version=record.version, lease=lease)


async def rewind_to_version(
    store: ThreadStore, thread_id: str, version: int, *, lease: Lease | None = None
) -> int:
    """Make the thread's history (and layer state) what it was at ``version`` again, in
    one write that replaces the whole live log (archived, so the later writes stay
    readable); the paused run is dropped. Returns the new version."""
    record = await store.load_thread(thread_id)
    old = await load_as_of(store, thread_id, version)
    change = ThreadWrite(
        compaction=Compaction(0, len(record.messages), old.messages),
        checkpoint=None,
        state=UNCHANGED if old.state is None else old.state,
    )
    return await store.write(thread_id, change, expected_version=record.version, lease=lease)
