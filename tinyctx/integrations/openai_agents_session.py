"""An OpenAI Agents SDK ``Session`` backed by a tinyctx thread store.

``Runner.run(agent, "...", session=TinyctxSession("user-42", SqliteStore("threads.db")))``
keeps the conversation as a tinyctx thread: any :class:`~tinyctx.threads.ThreadStore`
(SQLite, PostgreSQL, Redis, memory), one message per tinyctx message (an assistant turn
with its reasoning and function calls is one message), a compaction tinyctx commits
archived by the store.

Each write takes the thread's lease, the one a tinyctx ``Session`` takes (fencing
included), and carries it: ``async with session:`` holds it for the whole block (one
run, or several), renewed while it lasts, so no other writer — another runner on the same
session id, in any process, or a tinyctx ``Session`` — interleaves writes with the
block's; outside a block each write takes the lease for itself. A writer that finds the
lease held waits up to ``wait`` seconds, then gets :class:`~tinyctx.threads.LeaseHeld`
(a :class:`~tinyctx.SessionBusy` naming the holder). The lease is released when the block
or the write ends, shielded and bounded, on cancellation too. Writes are also made
against the version read (a write from a stale load is retried on the fresh thread,
never lost). The same thread opens
in a tinyctx :class:`~tinyctx.Session` (``tinyctx.Session(agent, thread_id="user-42",
store=store)``) and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import anyio
from agents.memory.session_settings import SessionSettings

from ..codec import decode_messages, encode_message
from ..config import number, optional, text
from ..durable import default_owner
from ..events import EventSink
from ..messages import AssistantMessage, Message
from ..providers._responses_items import assistant_from_output
from ..threads import Compaction, Lease, StaleThreadVersion, ThreadStore, ThreadWrite
from ._lease import Leasing
from ._threads import read_thread, write_thread
from .openai_agents_items import from_agents_items, plain_item, to_agents_items

__all__ = ["TinyctxSession", "import_session", "export_session"]

_ATTEMPTS = 3


def _open_turn(messages: Sequence[Message]) -> int:
    """Where the last assistant turn with tool calls starts (its results may still come)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):
            return index if message.tool_calls else len(messages)
    return len(messages)


class TinyctxSession:
    """The Agents SDK ``Session`` protocol (``get_items``, ``add_items``, ``pop_item``,
    ``clear_session``) over the tinyctx thread ``session_id`` of ``store``.

    Args:
        session_id: the tinyctx thread the conversation is kept in.
        store: any :class:`~tinyctx.threads.ThreadStore`.
        session_settings: the SDK's settings for this session (``limit``).
        lease_ttl: seconds a lease lasts unrenewed (a dead writer's expires after it).
        wait: seconds a writer waits for a lease another owner holds before
            :class:`~tinyctx.threads.LeaseHeld` (0: at once).
        owner: the lease owner's name (default ``host:pid:random``).
        events: where a failed lease renewal is reported (default: structlog).
    """

    def __init__(
        self,
        session_id: str,
        store: ThreadStore,
        *,
        session_settings: SessionSettings | None = None,
        lease_ttl: float = 30.0,
        wait: float = 0.0,
        owner: str | None = None,
        events: EventSink | None = None,
    ) -> None:
        text().check(session_id, "session_id", "TinyctxSession")
        number(above=0).check(lease_ttl, "lease_ttl", "TinyctxSession")
        number(minimum=0).check(wait, "wait", "TinyctxSession")
        optional(text()).check(owner, "owner", "TinyctxSession")
        self.session_id = session_id
        self.store = store
        self.session_settings = session_settings
        self.owner = owner or default_owner()
        self._lease = Leasing(
            store, session_id, owner=self.owner, ttl=lease_ttl, wait=wait, events=events
        )
        self._messages: tuple[Message, ...] = ()
        self._version = 0
        self._lock = anyio.Lock()

    async def __aenter__(self) -> Self:
        """Hold the thread's lease until the block ends (waiting up to ``wait`` seconds)."""
        await self._lease.hold()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._lease.let_go()

    @property
    def messages(self) -> tuple[Message, ...]:
        """The thread as this session last read or wrote it."""
        return self._messages

    async def _load(self) -> None:
        record = await self.store.load_thread(self.session_id)
        self._messages = decode_messages(record.messages)
        self._version = record.version

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The thread as SDK input items (the newest ``limit`` of them)."""
        async with self._lock:
            await self._load()
            items = to_agents_items(self._messages)
        if limit is None:
            return list(items)
        return list(items[-limit:]) if limit > 0 else []

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` to the thread, as the messages they say."""
        if not items:
            return
        async with self._lock, self._lease.writing() as lease:
            for attempt in range(_ATTEMPTS):
                await self._load()
                start = _open_turn(self._messages)
                context = to_agents_items(self._messages[start:])
                plain = [plain_item(item, i) for i, item in enumerate(items)]
                read = from_agents_items([*context, *plain])
                new = read[len(self._messages) - start :]
                change = ThreadWrite(append=tuple(encode_message(m) for m in new))
                if await self._write(change, attempt, lease):
                    self._messages = (*self._messages, *new)
                    return

    async def pop_item(self) -> Any | None:
        """Remove the newest item (from the last message; the message goes when it was
        its only item) and return it, or None for an empty thread."""
        async with self._lock, self._lease.writing() as lease:
            for attempt in range(_ATTEMPTS):
                await self._load()
                if not self._messages:
                    return None
                last = self._messages[-1]
                items = to_agents_items([last])
                popped = items[-1]
                replacement: tuple[Message, ...] = ()
                if len(items) > 1 and isinstance(last, AssistantMessage):
                    replacement = (assistant_from_output(items[:-1]),)
                n = len(self._messages)
                change = ThreadWrite(
                    compaction=Compaction(n - 1, n, tuple(encode_message(m) for m in replacement))
                )
                if await self._write(change, attempt, lease):
                    self._messages = (*self._messages[:-1], *replacement)
                    return popped
        return None

    async def clear_session(self) -> None:
        """Delete the thread (its messages, archive and state), under the lease; a held
        lease is taken again at once (the deletion removes it with the thread)."""
        async with self._lock, self._lease.writing():
            await self.store.delete_thread(self.session_id)
            self._messages, self._version = (), 0
            await self._lease.renew_held()

    async def commit(self, stored: Sequence[Message], replacement: Sequence[Message]) -> bool:
        """Replace the thread's messages ``stored`` (read earlier) with ``replacement`` as one
        compaction, the originals archived by the store; False (nothing written) when the
        thread no longer starts with ``stored``."""
        async with self._lock, self._lease.writing() as lease:
            await self._load()
            if self._messages[: len(stored)] != tuple(stored):
                return False
            change = ThreadWrite(
                compaction=Compaction(0, len(stored), tuple(encode_message(m) for m in replacement))
            )
            try:
                self._version = await self.store.write(
                    self.session_id, change, expected_version=self._version, lease=lease
                )
            except StaleThreadVersion:
                return False
            self._messages = (*replacement, *self._messages[len(stored) :])
            return True

    async def _write(self, change: ThreadWrite, attempt: int, lease: Lease | None) -> bool:
        """Write at the loaded version under ``lease``; False to retry on a fresh load after
        a concurrent write (the last attempt raises
        :class:`~tinyctx.threads.StaleThreadVersion`)."""
        try:
            self._version = await self.store.write(
                self.session_id, change, expected_version=self._version, lease=lease
            )
        except StaleThreadVersion:
            if attempt == _ATTEMPTS - 1:
                raise
            return False
        return True


async def import_session(
    session: Any, store: ThreadStore, *, into: str | None = None
) -> tuple[Message, ...]:
    """Copy the items of an Agents SDK session (``SQLiteSession``, any ``Session``) into the
    tinyctx thread ``into`` (default the session's id) of ``store``; returns the messages."""
    messages = from_agents_items(await session.get_items())
    await write_thread(store, into or session.session_id, messages)
    return messages


async def export_session(store: ThreadStore, thread_id: str, session: Any) -> list[Any]:
    """Make an Agents SDK session hold the tinyctx thread ``thread_id`` (it is cleared
    first); returns the items written."""
    items = to_agents_items(await read_thread(store, thread_id))
    await session.clear_session()
    await session.add_items(items)
    return items
