"""Pages of a thread through tinyctx.history.load_thread, on stores with and without windows."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import codec
from tinyctx.history import load_thread
from tinyctx.lifecycle import ThreadWindowStore
from tinyctx.messages import AssistantMessage, ToolCall, ToolResult, UserMessage
from tinyctx.stores import MemoryStore
from tinyctx.threads import ThreadRecord, ThreadWrite


class _WholeOnly:
    """A ThreadStore that can only load whole threads (a third-party store's shape)."""

    hidden = "load_window"

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.loads = 0

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        self.loads += 1
        return await self.inner.load_thread(thread_id)

    def __getattr__(self, name: str) -> Any:
        if name == self.hidden:
            raise AttributeError(name)
        return getattr(self.inner, name)


def _history() -> list[Any]:
    calls = (ToolCall("c1", "t"), ToolCall("c2", "t"))
    return [
        UserMessage("hi"),
        AssistantMessage("", calls),
        *(ToolResult.for_call(c, "ok") for c in calls),
        AssistantMessage("done"),
    ]


class TestPagesWithoutWindows:
    """A store without load_window still pages, by cutting the page out of a whole load."""

    async def test_the_page_is_cut_from_the_whole_thread(self) -> None:
        """The newest page reaches back to the call; the older page is the rest."""
        store = _WholeOnly(MemoryStore())
        assert not isinstance(store, ThreadWindowStore)
        history = _history()
        await store.inner.write(
            "t", ThreadWrite(codec.encode_messages(history)), expected_version=0
        )
        page = await load_thread(store, "t", limit=2)  # type: ignore[arg-type]
        assert page.messages == tuple(history[1:])
        older = await load_thread(store, "t", limit=2, before=page.before)  # type: ignore[arg-type]
        assert older.messages == tuple(history[:1])
        assert older.before is None

    async def test_an_unknown_thread_is_an_empty_page(self) -> None:
        """A thread never written is an empty page at version 0 with no older page."""
        page = await load_thread(MemoryStore(), "nobody", limit=5)
        assert (page.version, page.length, page.messages, page.before) == (0, 0, (), None)

    async def test_an_invalid_thread_id_is_refused(self) -> None:
        """The thread id is checked like every store checks it."""
        with pytest.raises(ValueError, match="thread_id"):
            await load_thread(MemoryStore(), "", limit=5)


class TestPruneArchives:
    """prune_archives prunes every thread of a store (or of a prefix)."""

    async def test_every_thread_under_the_prefix_is_pruned(self) -> None:
        """Two threads under the prefix lose their old originals; the other keeps them."""
        from tinyctx.retention import prune_archives
        from tinyctx.threads import Compaction

        store = MemoryStore()
        docs = codec.encode_messages([UserMessage("a"), UserMessage("b")])
        for thread in ("u:1", "u:2", "other"):
            await store.write(thread, ThreadWrite(docs), expected_version=0)
            change = ThreadWrite(compaction=Compaction(0, 1, docs[:1]))
            await store.write(thread, change, expected_version=1)
        assert await prune_archives(store, older_than=0, prefix="u:") == 2
        assert await store.archived("u:1") == []
        assert len(await store.archived("other")) == 1
        with pytest.raises(ValueError, match="older_than"):
            await prune_archives(store, older_than=-5)


class _NoErase(_WholeOnly):
    """A Store and ThreadStore without erase_thread (a third-party store's shape)."""

    hidden = "erase_thread"


class TestDeleteWithoutErase:
    """On a store without erase_thread, delete_threads_where deletes the thread and its
    label (delete_thread, then the label), and the thread's notes stay."""

    async def test_the_thread_and_label_go_and_its_notes_stay(self) -> None:
        """The labelled thread is deleted and unlabelled; its thread notes are kept."""
        from tinyctx.lifecycle import ThreadEraseStore
        from tinyctx.retention import delete_threads_where, set_thread_metadata, thread_metadata

        store = _NoErase(MemoryStore())
        assert not isinstance(store, ThreadEraseStore)
        await store.inner.write(
            "t", ThreadWrite(codec.encode_messages(_history())), expected_version=0
        )
        await set_thread_metadata(store, "t", {"user_id": "u1"})
        await store.inner.append_note("mem:thread:t", "kept")
        assert await delete_threads_where(store, "user_id", "u1") == ["t"]
        assert (await store.inner.load_thread("t")).version == 0
        assert await thread_metadata(store, "t") == {}
        assert [n.text for n in await store.inner.notes("mem:thread:t")] == ["kept"]
