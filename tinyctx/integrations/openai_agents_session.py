"""An OpenAI Agents SDK ``Session`` backed by a tinyctx thread store.

``Runner.run(agent, "...", session=TinyctxSession("user-42", SqliteStore("threads.db")))``
keeps the conversation as a tinyctx thread: any :class:`~tinyctx.threads.ThreadStore`
(SQLite, PostgreSQL, Redis, memory), one message per tinyctx message (an assistant turn
with its reasoning and function calls is one message), written with optimistic
concurrency (a write made from a stale load is refused and retried on the fresh thread,
never lost), and a compaction tinyctx commits archived by the store. The same thread opens
in a tinyctx :class:`~tinyctx.Session` (``tinyctx.Session(agent, thread_id="user-42",
store=store)``) and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from agents.memory.session_settings import SessionSettings

from ..codec import decode_messages, encode_message
from ..messages import AssistantMessage, Message
from ..providers._responses_items import assistant_from_output
from ..threads import Compaction, StaleThreadVersion, ThreadStore, ThreadWrite
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
    ``clear_session``) over the tinyctx thread ``session_id`` of ``store``."""

    def __init__(
        self,
        session_id: str,
        store: ThreadStore,
        *,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
        self.session_id = session_id
        self.store = store
        self.session_settings = session_settings
        self._messages: tuple[Message, ...] = ()
        self._version = 0
        self._lock = anyio.Lock()

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
        async with self._lock:
            for attempt in range(_ATTEMPTS):
                await self._load()
                start = _open_turn(self._messages)
                context = to_agents_items(self._messages[start:])
                plain = [plain_item(item, i) for i, item in enumerate(items)]
                read = from_agents_items([*context, *plain])
                new = read[len(self._messages) - start :]
                change = ThreadWrite(append=tuple(encode_message(m) for m in new))
                if await self._write(change, attempt):
                    self._messages = (*self._messages, *new)
                    return

    async def pop_item(self) -> Any | None:
        """Remove the newest item (from the last message; the message goes when it was
        its only item) and return it, or None for an empty thread."""
        async with self._lock:
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
                if await self._write(change, attempt):
                    self._messages = (*self._messages[:-1], *replacement)
                    return popped
        return None

    async def clear_session(self) -> None:
        """Delete the thread (its messages, archive, state and lease)."""
        async with self._lock:
            await self.store.delete_thread(self.session_id)
            self._messages, self._version = (), 0

    async def commit(self, stored: Sequence[Message], replacement: Sequence[Message]) -> bool:
        """Replace the thread's messages ``stored`` (read earlier) with ``replacement`` as one
        compaction, the originals archived by the store; False (nothing written) when the
        thread no longer starts with ``stored``."""
        async with self._lock:
            await self._load()
            if self._messages[: len(stored)] != tuple(stored):
                return False
            change = ThreadWrite(
                compaction=Compaction(0, len(stored), tuple(encode_message(m) for m in replacement))
            )
            try:
                self._version = await self.store.write(
                    self.session_id, change, expected_version=self._version
                )
            except StaleThreadVersion:
                return False
            self._messages = (*replacement, *self._messages[len(stored) :])
            return True

    async def _write(self, change: ThreadWrite, attempt: int) -> bool:
        """Write at the loaded version; False to retry on a fresh load after a concurrent
        write (the last attempt raises :class:`~tinyctx.threads.StaleThreadVersion`)."""
        try:
            self._version = await self.store.write(
                self.session_id, change, expected_version=self._version
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
