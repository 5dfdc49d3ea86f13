"""The thread's message log and its message events.

The conversation is one of the few mutable objects: owned by a session, shared by reference
with every context of it. Produced messages go through :meth:`Conversation.append`, so the
in-memory log and persistence subscribers cannot drift apart; messages a layer adds or a
compaction rewrites queue their events, which the loop flushes exactly once before the
next model request.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence

from attrs import frozen

from .messages import AssistantMessage, Message, check_messages, check_pairing
from .model import Usage
from .state import LayerStates

__all__ = [
    "Conversation",
    "ConversationChange",
    "MessageSubscriber",
    "MessageTap",
    "SyncPoint",
    "snapshot_stamp",
]

MessageSubscriber = Callable[[Message, "Usage | None"], Awaitable[None]]


@frozen
class ConversationChange:
    """What changed since the last :meth:`Conversation.mark_synced`, as storage applies it.

    First the synced messages ``[start, end)`` are replaced by ``replacement`` (a
    compaction; ``start == end`` and no replacement when there was none), then ``appended``
    is added at the end. Applied to the synced log it gives the conversation now.
    """

    start: int
    end: int
    replacement: tuple[Message, ...]
    appended: tuple[Message, ...]

    @property
    def compaction(self) -> bool:
        return self.start != self.end or bool(self.replacement)

    def __bool__(self) -> bool:
        return self.compaction or bool(self.appended)


_NO_CHANGE = ConversationChange(0, 0, (), ())


class SyncPoint:
    """Where a conversation's log was when a write of its changes was made
    (:meth:`Conversation.sync_point`): its length, the rewrites it had seen, and the log
    itself once a rewrite since needed it kept."""

    __slots__ = ("length", "log", "rewrites")

    def __init__(self, length: int, rewrites: int) -> None:
        self.length = length
        self.rewrites = rewrites
        self.log: tuple[Message, ...] | None = None

    def __repr__(self) -> str:
        return f"<SyncPoint at {self.length} messages>"


class MessageTap:
    """Every message committed to a conversation since the tap was opened, as it was
    committed (:meth:`Conversation.tap`).

    A later rewrite of the conversation (a tool result cleared, a head summarized, a
    relief) changes the conversation, never what the tap holds: a reader that must see
    every message once, originals included (a session-memory extractor, an audit log),
    reads :attr:`messages` and :meth:`drop` s what it has handled. Messages a rewrite put
    in (``replace(..., emit_new=False)``: a summary, a restored history) are not
    committed messages and are not recorded. The tap holds what it recorded until it is
    dropped or the tap is closed; :meth:`is_displaced` says which of them a rewrite took
    out of the conversation (what a store no longer holds as it was committed).
    """

    __slots__ = ("_closed", "_displaced", "_held", "_messages")

    def __init__(self, backlog: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = list(backlog)
        self._closed = False
        # ids of the held messages, and of those the conversation no longer holds (ids
        # are unique among live objects, and each of these is alive: held here)
        self._held: set[int] = {id(m) for m in self._messages}
        self._displaced: set[int] = set()

    @property
    def messages(self) -> tuple[Message, ...]:
        """What the tap holds, oldest first."""
        return tuple(self._messages)

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._messages)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MessageTap {state}, {len(self._messages)} messages>"

    def drop(self, count: int) -> None:
        """Forget the ``count`` oldest messages (handled); more than it holds is an error."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"MessageTap.drop: count must be an integer >= 0, got {count!r}")
        if count > len(self._messages):
            raise ValueError(
                f"MessageTap.drop: count {count} is more than the {len(self._messages)} "
                "messages the tap holds"
            )
        dropped = {id(m) for m in self._messages[:count]}
        self._held -= dropped
        self._displaced -= dropped
        del self._messages[:count]

    def is_displaced(self, message: Message) -> bool:
        """Whether ``message`` (one the tap holds) was taken out of the conversation by a
        rewrite since it was committed (cleared, summarized, trimmed)."""
        # exact: ids are unique among live objects, and every id kept is of a held one
        return id(message) in self._displaced

    def close(self) -> None:
        """Stop recording and forget what the tap holds."""
        self._closed = True
        self._messages.clear()
        self._held.clear()
        self._displaced.clear()

    def _record(self, message: Message) -> None:
        self._messages.append(message)
        self._held.add(id(message))

    def _moved(self, gone: set[int], back: set[int]) -> None:
        """A rewrite took the messages ``gone`` out of the conversation and holds ``back``
        (ids): the held ones among them are displaced, or no longer."""
        if gone:
            self._displaced |= gone & self._held
        if back and self._displaced:
            self._displaced -= back


class _LogRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a conversation that remembers the id of the snapshot it
    registered in ``_SNAPSHOTS`` (so a newer snapshot, or its death, takes that out)."""

    __slots__ = ("key",)
    key: int


_SNAPSHOTS: dict[int, _LogRef] = {}
"""id of each live conversation's current snapshot (:attr:`Conversation.messages`) -> the
conversation, weakly: at most one entry per conversation, checked on every look-up."""


def _unregister(ref: _LogRef) -> None:
    if _SNAPSHOTS.get(ref.key) is ref:
        del _SNAPSHOTS[ref.key]


def snapshot_stamp(messages: object) -> tuple[object, int] | None:
    """Where ``messages`` comes from, when it is a conversation's current snapshot (its
    :attr:`~Conversation.messages` now): the conversation (a token compared by identity)
    and how many rewrites it had seen; else None.

    Two snapshots of the same conversation with the same stamp differ only by messages
    appended at the end: the longer one starts with every message of the shorter (by
    identity), so a cache of the shorter one's total (a token counter's) may trust it
    without comparing the two, in O(1) instead of O(history).
    """
    ref = _SNAPSHOTS.get(id(messages))
    if ref is None:
        return None
    log = ref()
    # the check that makes a stale entry harmless: an id is unique among live objects,
    # and the conversation holds its current snapshot alive
    if log is None or log._snapshot is not messages:
        return None
    return ref, log._rewrites


def last_turn_start(history: Sequence[Message]) -> int:
    """The index of the message before the last assistant message's turn: the history
    before it is paired already (the loop and ``replace`` keep it so), so a check of what
    is added next needs only the history from there (cost: the last turn's length)."""
    start = len(history)
    while start > 0 and not isinstance(history[start - 1], AssistantMessage):
        start -= 1
    return max(start - 1, 0)


def _common_prefix(old: list[Message], new: list[Message]) -> int:
    """How many leading messages the two logs share (by identity)."""
    same = 0
    for a, b in zip(old, new, strict=False):
        if a is not b:
            break
        same += 1
    return same


class Conversation:
    """An ordered log of messages with exactly-once message events.

    It also tracks, for a store, what changed since the log was last written
    (:meth:`changes` / :meth:`mark_synced`) at O(new messages) per step: appends are
    counted, and a rewrite (``replace``, ``add`` at an index) lowers the index of the
    first message that may differ. ``layer_state`` holds the layers' per-thread durable
    state (``ctx.thread_state``), which travels with the thread.
    """

    __slots__ = (
        "__weakref__",
        "_appended",
        "_dirty_from",
        "_messages",
        "_pending",
        "_queued",
        "_ref",
        "_rewrites",
        "_snapshot",
        "_subscribers",
        "_synced_len",
        "_synced_log",
        "_taps",
        "_version",
        "layer_state",
    )

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = list(messages)
        self._snapshot: tuple[Message, ...] | None = None
        self._ref: _LogRef | None = None  # for snapshot_stamp, made with the first snapshot
        self._queued: list[tuple[Message, Usage | None]] = []
        self._subscribers: list[MessageSubscriber] = []
        self._version = 0
        # change tracking (for stores), O(1) per append: how many messages storage holds;
        # what they are, once a rewrite made them differ from the log's head (None: they
        # are the log's first ``_synced_len``, or, with ``_dirty_from`` set, unknown past
        # it); the lowest index that may differ (None: nothing rewritten); how many
        # messages were appended at the end since the last rewrite; how many rewrites
        # there were; and the sync point of a write in flight
        self._synced_len = 0
        self._synced_log: tuple[Message, ...] | None = None
        self._dirty_from: int | None = None
        self._appended = 0
        self._rewrites = 0
        self._pending: SyncPoint | None = None
        self._taps: list[MessageTap] = []
        self.layer_state = LayerStates()

    # -- reading -------------------------------------------------------------------------

    @property
    def messages(self) -> tuple[Message, ...]:
        """An immutable snapshot, cached until the next change."""
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = tuple(self._messages)
            self._stamped(snapshot)
        return snapshot

    def _stamped(self, snapshot: tuple[Message, ...]) -> None:
        """Register ``snapshot`` for :func:`snapshot_stamp` (and forget the last one)."""
        ref = self._ref
        if ref is None:
            ref = self._ref = _LogRef(self, _unregister)
        else:
            _unregister(ref)
        ref.key = id(snapshot)
        _SNAPSHOTS[ref.key] = ref

    @property
    def version(self) -> int:
        """Increments on every change; cheap to compare for caches."""
        return self._version

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __getitem__(self, index: int) -> Message:
        return self._messages[index]

    def since(self, start: int) -> tuple[Message, ...]:
        """The messages from index ``start`` on, in O(len - start): no copy of the whole
        log, as :attr:`messages` makes after each change."""
        return tuple(self._messages[start:])

    def last_turn(self) -> tuple[int, tuple[Message, ...]]:
        """Where the last turn starts (see :func:`last_turn_start`) and its messages."""
        start = last_turn_start(self._messages)
        return start, tuple(self._messages[start:])

    def __repr__(self) -> str:
        return f"<Conversation {len(self._messages)} messages, {len(self._queued)} queued events>"

    @property
    def queued_events(self) -> int:
        return len(self._queued)

    # -- subscribers ---------------------------------------------------------------------

    def subscribe(self, fn: MessageSubscriber) -> Callable[[], None]:
        """Persistence hook: ``await fn(message, usage)`` once per new message."""
        self._subscribers.append(fn)

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

        return unsubscribe

    # -- taps ----------------------------------------------------------------------------

    def tap(self, backlog: Iterable[Message] = ()) -> MessageTap:
        """A :class:`MessageTap` recording every message committed from now on (``append``,
        ``add``, and the new messages of ``replace(..., emit_new=True)``) as it was
        committed, whatever later rewrites the conversation; it starts holding
        ``backlog`` (e.g. the part of the history a reader has not handled yet)."""
        tap = MessageTap(backlog)
        if len(tap):  # a backlog message the log does not hold (any more) is displaced
            tap._moved(set(tap._held), {id(m) for m in self._messages})
        self._taps.append(tap)
        return tap

    def _tapped(self, messages: Iterable[Message]) -> None:
        taps = self._taps
        if any(tap.closed for tap in taps):
            taps[:] = [tap for tap in taps if not tap.closed]
        for message in messages:
            for tap in taps:
                tap._record(message)

    # -- writing -------------------------------------------------------------------------

    def _changed(self) -> None:
        self._snapshot = None
        self._version += 1

    async def append(self, message: Message, usage: Usage | None = None) -> None:
        """Append a produced message and notify subscribers now.

        The message is visible before subscribers run; a subscriber error propagates and
        does not roll the append back.
        """
        if not isinstance(message, Message):
            raise TypeError(f"expected a Message, got {type(message).__name__}")
        self._messages.append(message)
        self._snapshot = None  # self._changed(), inline: this runs for every message
        self._version += 1
        self._appended += 1
        if self._taps:
            self._tapped((message,))
        subscribers = self._subscribers
        if subscribers:
            for fn in tuple(subscribers):
                await fn(message, usage)

    def add(
        self, message: Message, *, index: int | None = None, usage: Usage | None = None
    ) -> None:
        """Insert a layer-owned message (at ``index``, default the end); its event is queued."""
        if not isinstance(message, Message):
            raise TypeError(f"expected a Message, got {type(message).__name__}")
        messages = self._messages
        if index is None or index >= len(messages):
            messages.append(message)
            self._appended += 1
        else:
            position = max(0, len(messages) + index) if index < 0 else index
            self._rewritten(position)
            messages.insert(index, message)
        self._changed()
        self._queued.append((message, usage))
        if self._taps:
            self._tapped((message,))

    def replace(self, messages: Sequence[Message], *, emit_new: bool = True) -> None:
        """Replace the whole log (compaction, restore).

        ``messages`` must keep the pairing rule (calls of the last assistant message may
        still wait for their results): a violation is a PairingError naming the index and
        the id, and the log is left as it was.

        With ``emit_new`` the messages that were not in the log before get queued events;
        restored or compacted history passes ``emit_new=False`` because storage already has
        those messages or a snapshot of them.
        """
        new = list(messages)
        check_messages(new)
        check_pairing(new)
        old = self._messages
        if emit_new:
            before = set(old)
            fresh = [m for m in new if m not in before]
            self._queued.extend((m, None) for m in fresh)
            if self._taps:
                self._tapped(fresh)
        # the first index where the logs differ (identity: equal-but-new objects count as
        # changed, which only makes the recorded range wider, never wrong)
        same = _common_prefix(old, new)
        if self._taps:
            back = {id(m) for m in new[same:]}
            gone = {id(m) for m in old[same:]} - back
            for tap in self._taps:
                tap._moved(gone, back)
        if same < len(old) or same < len(new):
            if same == len(old):
                self._appended += len(new) - same  # only appended at the end
            else:
                self._rewritten(same)
        self._messages = new
        self._changed()

    # -- change tracking (for stores) --------------------------------------------------

    def _rewritten(self, index: int) -> None:
        """The log is about to change at ``index`` and after (not only at its end): what
        storage holds, and what a write in flight wrote, are kept first while they are
        still the log's head (O(history), as the rewrite itself is)."""
        messages = self._messages
        dirty = self._dirty_from
        if dirty is None and self._synced_log is None:
            self._synced_log = tuple(messages[: self._synced_len])
        pending = self._pending
        if pending is not None and pending.log is None and pending.rewrites == self._rewrites:
            pending.log = tuple(messages[: pending.length])
        self._rewrites += 1
        if dirty is None or index < dirty:
            self._dirty_from = index
        self._appended = 0

    def sync_point(self) -> SyncPoint:
        """The log as it is now, for :meth:`mark_synced` once a write of :meth:`changes`
        has landed, in O(1): the log may change while the write is in flight."""
        point = self._pending = SyncPoint(len(self._messages), self._rewrites)
        return point

    def logged_at(self, point: SyncPoint) -> tuple[Message, ...] | None:
        """The log as it was at ``point`` (None when a rewrite since made it unknown)."""
        if point.rewrites == self._rewrites:
            return tuple(self._messages[: point.length])
        return point.log

    def mark_synced(self, written: tuple[Message, ...] | SyncPoint | None = None) -> None:
        """Storage now holds ``written`` (default: the log as it is now); :meth:`changes`
        starts from there.

        Pass the :meth:`sync_point` (or the snapshot) a write was made from when the log
        may have changed while the write was in flight: what changed since is then still
        reported (conservatively, from the first message that may differ).
        """
        if self._pending is written:
            self._pending = None
        if isinstance(written, SyncPoint):
            if written.rewrites == self._rewrites:  # only appends since: a head of the log
                self._synced_at(written.length)
                return
            log = written.log
            if log is None:  # unknown (not the newest point): all of it may differ
                self._synced_len, self._synced_log = written.length, None
                self._dirty_from, self._appended = 0, 0
                return
            written = log
        if written is None or written is self._snapshot:
            self._synced_at(len(self._messages))
            return
        same = _common_prefix(list(written), self._messages)
        if same == len(written):
            self._synced_at(same)
        else:
            self._synced_len, self._synced_log = len(written), written
            self._dirty_from, self._appended = same, 0

    def _synced_at(self, length: int) -> None:
        """Storage holds the log's first ``length`` messages."""
        self._synced_len, self._synced_log = length, None
        self._dirty_from = None
        self._appended = len(self._messages) - length

    @property
    def synced_length(self) -> int:
        """How many messages storage held at the last :meth:`mark_synced`."""
        return self._synced_len

    def changes(self) -> ConversationChange:
        """What changed since :meth:`mark_synced` (falsy when nothing did).

        Appends cost O(appended). A rewrite is narrowed to the smallest range: from the
        first index that may differ to the last synced message that is not again at the
        same distance before the appended tail.
        """
        messages = self._messages
        base = self._synced_len
        dirty = self._dirty_from
        if dirty is None or dirty >= base:
            if dirty is None and len(messages) == base:
                return _NO_CHANGE
            return ConversationChange(base, base, (), tuple(messages[base:]))
        tail = len(messages) - self._appended  # messages[tail:] were appended after the rewrite
        # the longest common suffix of synced[dirty:] and messages[dirty:tail]
        synced = self._synced_log
        keep = 0
        if synced is not None:
            limit = min(base - dirty, tail - dirty)
            while keep < limit and synced[base - 1 - keep] is messages[tail - 1 - keep]:
                keep += 1
        return ConversationChange(
            dirty,
            base - keep,
            tuple(messages[dirty : tail - keep]),
            tuple(messages[tail:]),
        )

    def add_message_event(self, message: Message, usage: Usage | None = None) -> None:
        """Queue an event for a message already in the log."""
        if message not in self._messages:
            raise ValueError("add_message_event: the message is not in the conversation")
        self._queued.append((message, usage))

    async def flush(self) -> int:
        """Deliver every queued event exactly once; returns how many were delivered.

        Each event leaves the queue before delivery, so a failing subscriber never causes
        a redelivery; events after the failure stay queued for the next flush.
        """
        delivered = 0
        while self._queued:
            message, usage = self._queued.pop(0)
            delivered += 1
            for fn in tuple(self._subscribers):
                await fn(message, usage)
        return delivered
