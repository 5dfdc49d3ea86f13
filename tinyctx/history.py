"""Reading a part of a thread: the newest messages, and older pages for a UI.

``await load_thread(store, thread_id, limit=50)`` returns a :class:`ThreadPage` with the
newest 50 messages of the thread, decoded, and ``page.before`` the cursor of the page
before it (``None`` at the start of the thread)::

    page = await load_thread(store, "t-1", limit=50)
    while page.before is not None:
        page = await load_thread(store, "t-1", limit=50, before=page.before)

A page is **pair-complete**: it never starts with a tool result whose call is on an older
page. When the ``limit`` would cut between an assistant's tool calls and their results,
the page reaches back to the assistant message (so it may hold more than ``limit``
messages); each page ends where the next newer one starts, so a call's results are never
on a page before it either.

A store that implements :class:`ThreadWindowStore` (every built-in store does) reads only
the messages of the page; another :class:`~tinyctx.threads.ThreadStore` works too, by
loading the whole thread and cutting the page out of it.
"""

from __future__ import annotations

from attrs import frozen

from .codec import decode_messages
from .lifecycle import ThreadWindow, ThreadWindowStore, window_of
from .messages import Message, ToolResult
from .threads import ThreadStore, check_thread_id

__all__ = ["ThreadPage", "load_thread"]

# how many older messages one extra read fetches when a page must reach back to a call
_REACH = 16
# reads of one page that may find the thread moved on before a consistent whole load
_ATTEMPTS = 4


@frozen
class ThreadPage:
    """A pair-complete part of a thread: ``messages`` are the live messages from index
    ``start`` on, as of ``version`` (the thread then had ``length`` live messages)."""

    thread_id: str
    version: int
    length: int
    start: int
    messages: tuple[Message, ...]

    @property
    def before(self) -> int | None:
        """The cursor of the older page (``load_thread(..., before=page.before)``), or None
        when this page starts at the beginning of the thread."""
        return self.start if self.start > 0 else None

    @property
    def stop(self) -> int:
        """The index after this page's last message."""
        return self.start + len(self.messages)


def _check_page_args(limit: int | None, before: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"load_thread(limit={limit!r}): limit must be None or an integer >= 1")
    if before is not None and (
        isinstance(before, bool) or not isinstance(before, int) or before < 0
    ):
        raise ValueError(
            f"load_thread(before={before!r}): before must be None or an integer >= 0 "
            "(a page's .before)"
        )


async def _window(store: ThreadStore, thread_id: str, stop: int | None, count: int) -> ThreadWindow:
    if isinstance(store, ThreadWindowStore):
        return await store.load_window(thread_id, stop=stop, count=count)
    record = await store.load_thread(thread_id)
    return window_of(thread_id, record.version, record.messages, stop, count)


async def _page(
    store: ThreadStore, thread_id: str, limit: int | None, before: int | None
) -> ThreadPage | None:
    """One attempt at the page; None when the thread moved on between two reads."""
    window = await _window(store, thread_id, before, limit if limit is not None else 1 << 62)
    version, start = window.version, window.start
    messages = decode_messages(window.messages, path=f"thread[{start}:]")
    while start > 0 and messages and isinstance(messages[0], ToolResult):
        older = await _window(store, thread_id, start, _REACH)
        if older.version != version:
            return None
        head = decode_messages(older.messages, path=f"thread[{older.start}:]")
        reached = None
        for index in range(len(head) - 1, -1, -1):
            if not isinstance(head[index], ToolResult):
                reached = index
                break
        if reached is None:
            messages, start = head + messages, older.start
        else:
            messages, start = head[reached:] + messages, older.start + reached
    return ThreadPage(thread_id, version, window.length, start, messages)


async def load_thread(
    store: ThreadStore, thread_id: str, *, limit: int | None = None, before: int | None = None
) -> ThreadPage:
    """The newest ``limit`` messages of the thread (all of them: None) before index
    ``before`` (None: the end), pair-complete (see the module docstring)."""
    check_thread_id(thread_id)
    _check_page_args(limit, before)
    for _ in range(_ATTEMPTS):
        page = await _page(store, thread_id, limit, before)
        if page is not None:
            return page
    # a busy thread: one whole read is one snapshot
    record = await store.load_thread(thread_id)
    docs = record.messages
    window = window_of(
        thread_id, record.version, docs, before, limit if limit is not None else len(docs)
    )
    start = window.start
    messages = decode_messages(docs[: window.start + len(window.messages)], path="thread")
    while start > 0 and isinstance(messages[start], ToolResult):
        start -= 1
    return ThreadPage(thread_id, record.version, window.length, start, messages[start:])
