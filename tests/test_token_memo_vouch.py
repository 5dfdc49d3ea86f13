"""A conversation vouches that its snapshot only grew; the token memo trusts it, never stale."""

from __future__ import annotations

import gc
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, UserMessage
from tinyctx.conversation import Conversation, snapshot_stamp
from tinyctx.tokens import HeuristicCounter


def _message(index: int, size: int) -> Message:
    text = f"message {index} " + "word " * size
    return UserMessage(text) if index % 2 else AssistantMessage(text)


class TestSnapshotStamp:
    """A snapshot's stamp is the same exactly while the conversation only grows."""

    def test_appends_keep_the_stamp_and_a_rewrite_changes_it(self) -> None:
        conversation = Conversation([_message(0, 1)])
        first = conversation.messages
        stamp = snapshot_stamp(first)
        assert stamp is not None
        conversation.add(_message(1, 2))
        grown = conversation.messages
        assert snapshot_stamp(grown) == stamp
        conversation.replace([*grown, _message(2, 3)])  # a replace that only appends
        assert snapshot_stamp(conversation.messages) == stamp
        conversation.add(_message(3, 1), index=0)
        assert snapshot_stamp(conversation.messages) not in (None, stamp)

    def test_only_a_current_snapshot_has_a_stamp(self) -> None:
        conversation = Conversation([_message(0, 1), _message(1, 1)])
        old = conversation.messages
        conversation.add(_message(2, 1))
        assert snapshot_stamp(old) is None  # no longer what the conversation holds
        assert snapshot_stamp(tuple(conversation.messages)) is not None  # tuple() of a tuple
        assert snapshot_stamp(conversation.since(0)) is None  # an equal copy, not the snapshot
        assert snapshot_stamp(list(conversation.messages)) is None

    def test_two_conversations_never_share_a_stamp(self) -> None:
        messages = [_message(0, 1), _message(1, 1)]
        one, two = Conversation(messages), Conversation(messages)
        assert snapshot_stamp(one.messages) != snapshot_stamp(two.messages)

    def test_a_dropped_conversation_leaves_nothing_alive(self) -> None:
        """Stamps hold conversations weakly: its history goes with the conversation."""
        counter = HeuristicCounter()
        conversation = Conversation([_message(i, 3) for i in range(20)])
        refs = [weakref.ref(m) for m in conversation.messages]
        counter.count_messages(conversation.messages)
        conversation.add(_message(20, 1))
        counter.count_messages(conversation.messages)
        del conversation
        counter.count_messages((UserMessage("the next session"),))
        gc.collect()
        assert [r for r in refs if r() is not None] == []


def _cold(messages: tuple[Message, ...]) -> int:
    return HeuristicCounter().count_messages(messages)


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "extend", "compact", "copy", "insert", "truncate", "other"]),
        st.integers(0, 2),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=30,
)


class _Spy(HeuristicCounter):
    """Records every string it really measures (memo misses)."""

    def __init__(self) -> None:
        super().__init__()
        self.measured: list[str] = []

    def count_text(self, text: str) -> int:
        self.measured.append(text)
        return super().count_text(text)


class TestSharedCounterHandover:
    """Conversations taking turns on one counter hand over in O(1) and stay warm."""

    def test_turns_measure_only_new_messages_and_keep_no_weak_reference_per_message(
        self,
    ) -> None:
        counter = _Spy()
        sessions = [Conversation([_message(i, 3) for i in range(30)]) for _ in range(3)]
        for conversation in sessions:
            counter.count_messages(conversation.messages)
        for turn in range(3):
            counter.measured.clear()
            for index, conversation in enumerate(sessions):
                conversation.add(UserMessage(f"turn {turn} of {index}"))
                history = conversation.messages
                assert counter.count_messages(history) == _cold(history)
            assert counter.measured == [f"turn {turn} of {i}" for i in range(3)]
        every = [m for conversation in sessions for m in conversation.messages]
        assert [weakref.getweakrefcount(m) for m in every] == [0] * len(every)

    def test_a_rewritten_conversation_is_counted_again_whole(self) -> None:
        """After a rewrite its old total is never reused, even at the same length."""
        counter = HeuristicCounter()
        one = Conversation([_message(i, 3) for i in range(10)])
        two = Conversation([_message(i, 1) for i in range(5)])
        counter.count_messages(one.messages)
        counter.count_messages(two.messages)  # one's total waits with its stamp
        log = list(one.messages)
        log[4] = UserMessage("a much longer message " * 40)
        one.replace(log)  # same length, same first and last message
        assert counter.count_messages(one.messages) == _cold(one.messages)


class TestVouchedCounts:
    """Whatever a conversation went through, a shared counter answers a cold count."""

    @settings(max_examples=150, deadline=None)
    @given(steps=_STEPS, max_memo=st.sampled_from([4, 16, 200_000]))
    def test_any_sequence_of_changes_counts_like_a_cold_count(
        self, steps: list[tuple[str, int, int]], max_memo: int
    ) -> None:
        """Appends (vouched), compactions, equal-looking copies, inserts and truncations
        on three conversations sharing one counter, counted after every change."""
        counter = HeuristicCounter(max_memo=max_memo)
        conversations = [Conversation([_message(i, i % 7)]) for i in range(3)]
        made = 100
        for action, which, size in steps:
            conversation = conversations[which]
            log = list(conversation.messages)
            made += 1
            if action == "append":
                conversation.add(_message(made, size))
            elif action == "extend":
                conversation.replace([*log, _message(made, size), _message(made + 1, 1)])
            elif action == "compact":  # the head summarized: fewer messages, the tail kept
                conversation.replace([UserMessage("summary " * size), *log[len(log) // 2 :]])
            elif action == "copy":  # equal messages, new objects, one of them different
                copies: list[Message] = [UserMessage(m.text) for m in log]
                copies[size % len(copies)] = UserMessage("changed " * size)
                conversation.replace(copies)
            elif action == "insert":
                conversation.add(_message(made, size), index=size % len(log))
            elif action == "truncate" and len(log) > 1:
                conversation.replace(log[: 1 + size % (len(log) - 1)])
            elif action == "other":  # a tuple no conversation made, equal to a snapshot
                assert counter.count_messages(tuple(log)) == _cold(tuple(log))
            history = conversation.messages
            assert counter.count_messages(history) == _cold(history)
            assert counter.count_messages(history) == _cold(history)

    def test_a_grown_snapshot_measures_only_its_new_messages(self) -> None:
        """The vouched path still measures just what was appended."""
        counter = _Spy()
        conversation = Conversation([_message(i, 2) for i in range(50)])
        counter.count_messages(conversation.messages)
        counter.measured.clear()
        for i in range(3):
            conversation.add(UserMessage(f"new {i}"))
            history = conversation.messages
            assert counter.count_messages(history) == _cold(history)
        assert counter.measured == ["new 0", "new 1", "new 2"]
