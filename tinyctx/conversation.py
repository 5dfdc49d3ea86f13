"""The thread's message log and its message events.

The conversation is one of the few mutable objects: owned by a session, shared by reference
with every context of it. Produced messages go through :meth:`Conversation.append`, so the
in-memory log and persistence subscribers cannot drift apart; messages a layer adds or a
compaction rewrites queue their events, which the loop flushes exactly once before the
next model request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence

from .messages import Message, check_pairing
from .model import Usage

__all__ = ["Conversation", "MessageSubscriber"]

MessageSubscriber = Callable[[Message, "Usage | None"], Awaitable[None]]


class Conversation:
    """An ordered log of messages with exactly-once message events."""

    __slots__ = ("_messages", "_queued", "_snapshot", "_subscribers", "_version")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = list(messages)
        self._snapshot: tuple[Message, ...] | None = None
        self._queued: list[tuple[Message, Usage | None]] = []
        self._subscribers: list[MessageSubscriber] = []
        self._version = 0

    # -- reading -------------------------------------------------------------------------

    @property
    def messages(self) -> tuple[Message, ...]:
        """An immutable snapshot, cached until the next change."""
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = tuple(self._messages)
        return snapshot

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
        self._changed()
        for fn in tuple(self._subscribers):
            await fn(message, usage)

    def add(
        self, message: Message, *, index: int | None = None, usage: Usage | None = None
    ) -> None:
        """Insert a layer-owned message (at ``index``, default the end); its event is queued."""
        if not isinstance(message, Message):
            raise TypeError(f"expected a Message, got {type(message).__name__}")
        if index is None:
            self._messages.append(message)
        else:
            self._messages.insert(index, message)
        self._changed()
        self._queued.append((message, usage))

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
        for index, message in enumerate(new):
            if not isinstance(message, Message):
                raise TypeError(
                    f"messages[{index}] must be a Message, got {type(message).__name__}"
                )
        check_pairing(new)
        if emit_new:
            before = set(self._messages)
            self._queued.extend((m, None) for m in new if m not in before)
        self._messages = new
        self._changed()

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
