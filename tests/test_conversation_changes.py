"""Conversation change tracking: what a store must apply to match the log, at O(new) cost."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, UserMessage
from tinyctx.conversation import Conversation, ConversationChange


def apply(stored: list[Message], change: ConversationChange) -> list[Message]:
    """What a ThreadStore does with one write: the compaction first, then the append."""
    out = stored[: change.start] + list(change.replacement) + stored[change.end :]
    return out + list(change.appended)


def msg(n: int) -> Message:
    return UserMessage(f"m{n}") if n % 2 else AssistantMessage(f"a{n}")


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("add"), st.integers(0, 40)),
        st.tuples(st.just("replace_range"), st.integers(0, 40), st.integers(0, 5)),
        st.tuples(st.just("rewrite_one"), st.integers(0, 40)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("sync_while_changing"), st.integers(0, 3)),
        st.tuples(st.just("point_while_changing"), st.integers(0, 3)),
    ),
    max_size=30,
)


async def _change_meanwhile(
    conversation: Conversation, how: int, messages: list[Message], counter: Iterator[int]
) -> None:
    """What may happen to the log while a write is in flight: an append, a truncation, an
    insertion at the head, or nothing."""
    if how == 0:
        await conversation.append(msg(next(counter)))
    elif how == 1 and messages:
        conversation.replace(messages[:-1], emit_new=False)
    elif how == 2:
        conversation.add(msg(next(counter)), index=0)


class TestChanges:
    """Applying the reported change to the synced log always gives the log now."""

    async def test_appends_are_reported_as_appends(self) -> None:
        """Only new messages are reported after appends: no compaction, O(new)."""
        conversation = Conversation()
        await conversation.append(msg(1))
        conversation.mark_synced()
        await conversation.append(msg(2))
        conversation.add(msg(3))
        change = conversation.changes()
        assert not change.compaction
        assert change.appended == (msg(2), msg(3))
        assert (change.start, change.end) == (1, 1)

    async def test_a_compaction_is_narrowed_to_the_changed_range(self) -> None:
        """Rewriting one old message then appending reports just that range and the append."""
        conversation = Conversation()
        for n in range(6):
            await conversation.append(msg(n))
        conversation.mark_synced()
        messages = list(conversation.messages)
        messages[2] = UserMessage("[cleared]")
        conversation.replace(messages, emit_new=False)
        await conversation.append(msg(9))
        change = conversation.changes()
        assert (change.start, change.end) == (2, 3)
        assert change.replacement == (UserMessage("[cleared]"),)
        assert change.appended == (msg(9),)

    def test_nothing_changed_is_falsy(self) -> None:
        """A synced conversation reports no change; an identical replace changes nothing."""
        conversation = Conversation([msg(1), msg(2)])
        assert conversation.changes().appended == (msg(1), msg(2))
        conversation.mark_synced()
        assert not conversation.changes()
        conversation.replace(list(conversation.messages))
        assert not conversation.changes()
        assert conversation.synced_length == 2

    @given(initial=st.integers(0, 8), ops=operations)
    async def test_applying_changes_reproduces_the_log(self, initial: int, ops: list[Any]) -> None:
        """Whatever happened, the synced log plus the change equals the conversation."""
        counter = iter(range(1000, 10**6))
        conversation = Conversation()
        for n in range(initial):
            await conversation.append(msg(n))
        stored: list[Message] = []
        for op in ops:
            kind = op[0]
            messages = list(conversation.messages)
            if kind == "append":
                for _ in range(op[1]):
                    await conversation.append(msg(next(counter)))
            elif kind == "add":
                conversation.add(msg(next(counter)), index=min(op[1], len(messages)))
            elif kind == "replace_range":
                start = min(op[1], len(messages))
                end = min(start + op[2], len(messages))
                messages[start:end] = [msg(next(counter))]
                conversation.replace(messages, emit_new=False)
            elif kind == "rewrite_one" and messages:
                messages[op[1] % len(messages)] = msg(next(counter))
                conversation.replace(messages, emit_new=False)
            elif kind == "truncate":
                conversation.replace(messages[: op[1]], emit_new=False)
            elif kind == "sync":
                stored = apply(stored, conversation.changes())
                conversation.mark_synced()
                assert stored == list(conversation.messages)
            elif kind == "sync_while_changing":
                # a write in flight while the log changes: the change made after the
                # snapshot must still be reported by the next changes()
                change, written = conversation.changes(), conversation.messages
                await _change_meanwhile(conversation, op[1], messages, counter)
                stored = apply(stored, change)
                conversation.mark_synced(written)
            elif kind == "point_while_changing":
                # the same with an O(1) sync point instead of a snapshot of the log
                change, point = conversation.changes(), conversation.sync_point()
                at_point = list(conversation.messages)
                await _change_meanwhile(conversation, op[1], messages, counter)
                assert list(conversation.logged_at(point) or ()) == at_point
                stored = apply(stored, change)
                conversation.mark_synced(point)
            change = conversation.changes()
            assert apply(stored, change) == list(conversation.messages)
            assert change.start <= change.end <= len(stored)


class TestSyncPoints:
    """A write's sync point marks what it wrote without a copy of the log."""

    async def test_appends_while_writing_stay_pending(self) -> None:
        """Messages appended while a write is in flight are the next write's append."""
        conversation = Conversation([msg(1)])
        change, point = conversation.changes(), conversation.sync_point()
        await conversation.append(msg(2))
        conversation.mark_synced(point)
        assert change.appended == (msg(1),)
        assert conversation.changes().appended == (msg(2),)
        assert conversation.synced_length == 1

    async def test_an_older_point_after_a_rewrite_rewrites_everything(self) -> None:
        """A point that is not the newest, marked after a rewrite it did not see kept,
        reports the whole log as replaced: wider than needed, never wrong."""
        conversation = Conversation([msg(1), msg(2)])
        older = conversation.sync_point()
        conversation.sync_point()  # the newest point: the one a rewrite keeps the log for
        conversation.replace([msg(3)], emit_new=False)
        conversation.mark_synced(older)
        change = conversation.changes()
        assert (change.start, change.end, change.replacement) == (0, 2, (msg(3),))
        assert apply([msg(1), msg(2)], change) == [msg(3)]

    async def test_reads_do_not_copy_the_log(self) -> None:
        """``since`` and ``last_turn`` read the end of the log as the snapshot would."""
        conversation = Conversation([msg(1), msg(2), msg(3), msg(4)])
        assert conversation.since(2) == conversation.messages[2:]
        start, tail = conversation.last_turn()
        assert conversation.messages[start:] == tail
