"""Context-pressure policies on their own: DropNonessential and TrimOldest (pure functions
and PressurePolicy objects)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    ConfigError,
    Message,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.messages import safe_boundaries
from tinyctx.middleware import DropNonessential, PressurePolicy, Relief, TrimOldest
from tinyctx.middleware.drop_nonessential import drop_nonessential_messages, droppable_groups
from tinyctx.middleware.trim import digest_end, trim_oldest
from tinyctx.testing import assert_pairing_intact, strategies
from tinyctx.tokens import HeuristicCounter

COUNTER = HeuristicCounter()
needs = st.none() | st.integers(-5, 400)


def _turn(
    call_id: str, *, essential: bool = True, result_essential: bool | None = None
) -> list[Message]:
    call = ToolCall(call_id, "search", {"q": call_id})
    result_flag = essential if result_essential is None else result_essential
    return [
        AssistantMessage("", (call,), essential=essential),
        ToolResult(call_id, f"result of {call_id} " * 20, "search", essential=result_flag),
    ]


def _removed(before: tuple[Message, ...], after: tuple[Message, ...]) -> list[Message]:
    kept = {id(m) for m in after}
    return [m for m in before if id(m) not in kept]


def _summary(text: str) -> UserMessage:
    """A summary as Summarize marks it."""
    return UserMessage(text, metadata={"tinyctx": {"summary": {"messages": 3}}})


def _digested(
    raw: tuple[Message, ...], *, system: bool = True, task: bool = True, summaries: int = 2
) -> tuple[tuple[Message, ...], int]:
    """``raw`` behind a digest (system prompt, task, summaries), and where the digest ends."""
    head: list[Message] = [SystemMessage("rules")] if system else []
    if task:
        head.append(UserMessage("the task: fix the failing test"))
    head += [_summary(f"summary {i}: " + "earlier work " * 10) for i in range(summaries)]
    return (*head, *raw), len(head) if summaries else 0


def _trimmed(
    history: tuple[Message, ...], keep_recent: int, need: int | None
) -> tuple[Relief, list[Message]]:
    """trim_oldest's relief and what it removed, checked for what every trim keeps: pairing,
    the system messages and the newest keep_recent messages."""
    relief = trim_oldest(history, keep_recent=keep_recent, need=need, counter=COUNTER)
    after = relief.messages
    assert_pairing_intact(after, history)
    _assert_systems_kept(history, after)
    n = len(history)
    assert after[len(after) - min(keep_recent, n) :] == history[n - min(keep_recent, n) :]
    return relief, _removed(history, after)


def _assert_systems_kept(before: tuple[Message, ...], after: tuple[Message, ...]) -> None:
    kept = {id(m) for m in after}
    assert all(id(m) in kept for m in before if isinstance(m, SystemMessage))


class TestDropNonessential:
    """Non-essential messages go oldest first, whole tool turns only, never a system message."""

    def test_drops_oldest_first_until_need_is_met(self) -> None:
        old = UserMessage("retrieved doc A " * 30, essential=False)
        new = UserMessage("retrieved doc B " * 30, essential=False)
        history = (SystemMessage("rules"), old, UserMessage("question"), new)
        relief = drop_nonessential_messages(history, need=1, counter=COUNTER)
        assert relief.messages == (history[0], history[2], new)
        assert relief.freed_tokens == COUNTER.count_message(old)
        assert relief.detail == {"dropped": 1}
        everything = drop_nonessential_messages(history, counter=COUNTER)
        assert everything.messages == (history[0], history[2])

    def test_never_drops_a_system_message(self) -> None:
        history = (SystemMessage("optional rules", essential=False), UserMessage("hi"))
        relief = drop_nonessential_messages(history)
        assert relief.messages == history and relief.freed_tokens == 0 and not relief.changed

    def test_tool_turns_go_whole_and_only_when_all_of_them_is_nonessential(self) -> None:
        droppable = _turn("c1", essential=False)
        mixed = _turn("c2", essential=False, result_essential=True)
        history = (UserMessage("go"), *droppable, *mixed, UserMessage("next"))
        relief = drop_nonessential_messages(history)
        assert relief.messages == (history[0], *mixed, history[-1])
        assert_pairing_intact(relief.messages, history)

    def test_a_turn_whose_calls_are_running_is_never_dropped(self) -> None:
        call = ToolCall("c9", "search", {})
        history = (UserMessage("go"), AssistantMessage("", (call,), essential=False))
        assert droppable_groups(history) == []
        assert drop_nonessential_messages(history).messages == history

    def test_nothing_needed_changes_nothing(self) -> None:
        history = (UserMessage("doc", essential=False),)
        assert drop_nonessential_messages(history, need=0).messages is not None
        assert drop_nonessential_messages(history, need=0).freed_tokens == 0

    async def test_policy_object_uses_the_guard_need(self) -> None:
        policy = DropNonessential()
        assert isinstance(policy, PressurePolicy)
        assert policy.name == "DropNonessential" and policy.role == "drop"
        history = (UserMessage("a " * 50, essential=False), UserMessage("b " * 50, essential=False))
        relief = await policy.relieve(history, RunContext.new(), COUNTER, need=1)
        assert isinstance(relief, Relief)
        assert relief.messages == (history[1],)
        with pytest.raises(ConfigError, match="name"):
            DropNonessential(name="")

    @given(strategies.histories(max_turns=14), needs)
    def test_properties_on_generated_histories(
        self, history: tuple[Message, ...], need: int | None
    ) -> None:
        relief = drop_nonessential_messages(history, need=need, counter=COUNTER)
        after = relief.messages
        assert_pairing_intact(after, history)
        _assert_systems_kept(history, after)
        removed = _removed(history, after)
        assert all(not m.essential for m in removed), "only non-essential messages go"
        assert relief.freed_tokens == sum(COUNTER.count_message(m) for m in removed)
        # oldest first: the dropped groups are a prefix of the droppable groups
        groups = droppable_groups(history)
        removed_ids = {id(m) for m in removed}
        flags = [all(id(history[i]) in removed_ids for i in g) for g in groups]
        assert flags == sorted(flags, reverse=True)
        if need is not None and need > 0 and relief.freed_tokens < need:
            assert all(flags), "stopped early without freeing enough"


class TestTrimKeepingTheTask:
    """keep_task=True: the first user message (the task) goes last, only when nothing
    else frees enough."""

    def test_the_task_stays_while_later_turns_free_enough(self) -> None:
        """The oldest turns after the task go first; the task and the system prompt stay."""
        history = (
            SystemMessage("rules"),
            UserMessage("the task " * 20),
            *_turn("c1"),
            *_turn("c2"),
            UserMessage("next"),
            *_turn("c3"),
        )
        need = sum(COUNTER.count_message(m) for m in history[2:4])
        kept = trim_oldest(history, keep_recent=2, need=need, counter=COUNTER, keep_task=True)
        assert kept.messages[:2] == history[:2]
        assert history[2] not in kept.messages
        assert_pairing_intact(kept.messages, history)
        plain = trim_oldest(history, keep_recent=2, need=need, counter=COUNTER)
        assert history[1] not in plain.messages  # without keep_task the task goes first

    def test_the_task_goes_last_when_nothing_else_is_enough(self) -> None:
        """When everything up to the kept tail is not enough, the task goes too."""
        history = (UserMessage("the task"), *_turn("c1"), UserMessage("last"))
        relief = trim_oldest(history, keep_recent=1, need=10_000, counter=COUNTER, keep_task=True)
        assert relief.messages == (history[-1],)

    @given(history=strategies.histories(), need=st.integers(0, 400))
    def test_pairing_survives_and_the_task_is_kept_when_the_rest_suffices(
        self, history: tuple[Message, ...], need: int
    ) -> None:
        """On any history the cut keeps pairing, and the task goes only when all else that
        may go did not free ``need``."""
        relief = trim_oldest(history, keep_recent=2, need=need, counter=COUNTER, keep_task=True)
        assert_pairing_intact(relief.messages, history)
        lead = [m for m in history if not isinstance(m, SystemMessage)]
        if not lead or not isinstance(lead[0], UserMessage):
            return
        task = lead[0]
        if not any(m is task for m in relief.messages):
            assert relief.freed_tokens - COUNTER.count_message(task) < need

    @pytest.mark.parametrize("value", [1, "yes", None])
    def test_keep_task_must_be_a_bool(self, value: Any) -> None:
        """A non-bool keep_task is refused, naming the field."""
        with pytest.raises(ConfigError, match="keep_task"):
            TrimOldest(keep_task=value)


class TestTrimOldest:
    """The oldest messages go first, cut only between tool turns; system messages and the
    newest keep_recent messages stay."""

    def test_trims_everything_older_than_keep_recent(self) -> None:
        history = tuple(UserMessage(f"m{i}") for i in range(10))
        relief = trim_oldest(history, keep_recent=3)
        assert relief.messages == history[-3:]
        assert relief.detail == {"removed": 7, "kept": 3}

    def test_system_messages_are_kept_wherever_they_stand(self) -> None:
        history = (
            SystemMessage("rules"),
            UserMessage("a"),
            SystemMessage("late rules"),
            UserMessage("b"),
            UserMessage("c"),
        )
        relief = trim_oldest(history, keep_recent=1)
        assert relief.messages == (history[0], history[2], history[4])

    def test_never_cuts_inside_a_tool_turn(self) -> None:
        history = (UserMessage("go"), *_turn("c1"), *_turn("c2"), UserMessage("done"))
        # keeping 2 would cut between call c2 and its result: the cut moves back
        relief = trim_oldest(history, keep_recent=2)
        assert relief.messages == history[3:]
        assert_pairing_intact(relief.messages, history)

    def test_need_limits_how_much_goes(self) -> None:
        history = tuple(UserMessage("word " * 40) for _ in range(10))
        one = COUNTER.count_message(history[0])
        relief = trim_oldest(history, keep_recent=0, need=one + 1, counter=COUNTER)
        assert relief.messages == history[2:]
        assert relief.freed_tokens == 2 * one
        assert trim_oldest(history, keep_recent=0, need=0).messages == history

    @pytest.mark.parametrize("value", [-1, 1.5, "3", True, None])
    def test_keep_recent_must_be_a_count(self, value: Any) -> None:
        with pytest.raises(ConfigError, match="keep_recent") as info:
            TrimOldest(keep_recent=value)
        assert ">= 0" in str(info.value)

    async def test_policy_object(self) -> None:
        policy = TrimOldest(keep_recent=1)
        assert isinstance(policy, PressurePolicy) and policy.role == "trim"
        history = (UserMessage("a"), UserMessage("b"))
        relief = await policy.relieve(history, RunContext.new(), COUNTER, need=10_000)
        assert relief.messages == (history[1],)

    def test_raw_turns_after_a_summary_go_before_it(self) -> None:
        """The task and the summaries stay while the raw turns after them free enough."""
        raw = (*_turn("c1"), *_turn("c2"), UserMessage("next"), *_turn("c3"))
        history, digest = _digested(raw)
        assert digest_end(history) == digest == 4
        need = sum(COUNTER.count_message(m) for m in raw[:3])
        relief = trim_oldest(history, keep_recent=2, need=need, counter=COUNTER)
        assert relief.messages == (*history[:digest], *raw[4:])  # the two turns went
        assert relief.detail == {"removed": 4, "kept": 7}

    def test_the_digest_goes_last_summaries_first_and_the_task_last(self) -> None:
        """Not enough in the raw turns: the oldest summary goes next, the task after all."""
        raw = (*_turn("c1"), UserMessage("latest"))
        history, digest = _digested(raw, summaries=2)
        task, first, second = history[1:4]
        raw_tokens = sum(COUNTER.count_message(m) for m in raw[:2])
        step = trim_oldest(
            history, keep_recent=1, need=raw_tokens + COUNTER.count_message(first), counter=COUNTER
        )
        assert step.messages == (history[0], task, second, raw[-1])
        everything = trim_oldest(history, keep_recent=1, need=10**9, counter=COUNTER)
        assert everything.messages == (history[0], raw[-1])
        just_task = trim_oldest(
            history,
            keep_recent=1,
            need=raw_tokens + COUNTER.count_message(first) + COUNTER.count_message(second) + 1,
            counter=COUNTER,
        )
        assert just_task.messages == (history[0], raw[-1])
        assert trim_oldest(history, keep_recent=1).messages == (history[0], raw[-1])

    def test_a_history_without_a_summary_has_no_digest(self) -> None:
        """A first user message alone is not a digest: it goes first, as before."""
        history, _ = _digested((UserMessage("a"), UserMessage("b")), summaries=0)
        assert digest_end(history) == 0
        assert digest_end((_summary("s"), SystemMessage("late"), _summary("t"))) == 3
        relief = trim_oldest(history, keep_recent=1, need=1, counter=COUNTER)
        assert relief.messages == (history[0], *history[2:])

    @given(
        strategies.histories(max_turns=10),
        st.integers(0, 10),
        needs,
        st.booleans(),
        st.integers(1, 3),
    )
    def test_properties_with_a_digest_in_front(
        self,
        raw: tuple[Message, ...],
        keep_recent: int,
        need: int | None,
        task: bool,
        summaries: int,
    ) -> None:
        """Pairing, system messages and the tail kept; a digest message goes only when every
        raw message before the kept tail went, summaries oldest first, the task last."""
        raw = tuple(m for m in raw if not isinstance(m, SystemMessage))
        history, digest = _digested(raw, task=task, summaries=summaries)
        relief, removed = _trimmed(history, keep_recent, need)
        n = len(history)
        gone = {id(m) for m in removed}
        safe = safe_boundaries(history)
        limit = max(i for i in range(n - min(keep_recent, n) + 1) if safe[i])
        digest = min(digest, limit)  # a digest inside the kept tail is kept with it
        pinned = [m for m in history[:digest] if not isinstance(m, SystemMessage)]
        if task and pinned:
            pinned.append(pinned.pop(0))
        went = [id(m) for m in pinned if id(m) in gone]
        assert went == [id(m) for m in pinned[: len(went)]], "the digest goes in its order"
        if went:
            assert all(id(m) in gone for m in history[digest:limit]), "raw turns go first"
        assert relief.freed_tokens == sum(COUNTER.count_message(m) for m in removed)
        if need is not None and need > 0 and relief.freed_tokens >= need and went:
            # the digest lost no more than it had to
            spared = relief.freed_tokens - COUNTER.count_message(
                next(m for m in reversed(pinned) if id(m) in gone)
            )
            assert spared < need

    @given(strategies.histories(max_turns=14), st.integers(0, 12), needs)
    def test_properties_on_generated_histories(
        self, history: tuple[Message, ...], keep_recent: int, need: int | None
    ) -> None:
        relief, removed = _trimmed(history, keep_recent, need)
        if removed:
            # what went is a head of the history (system messages aside), cut at a safe place
            last = max(i for i, m in enumerate(history) if any(m is r for r in removed))
            head = [m for m in history[: last + 1] if not isinstance(m, SystemMessage)]
            assert [id(m) for m in head] == [id(m) for m in removed]
            assert safe_boundaries(history)[last + 1]
        assert relief.freed_tokens == sum(COUNTER.count_message(m) for m in removed)
