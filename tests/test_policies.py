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
    HeuristicCounter,
    Message,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
    safe_boundaries,
)
from tinyctx.middleware import (
    DropNonessential,
    PressurePolicy,
    Relief,
    TrimOldest,
    drop_nonessential_messages,
    trim_oldest,
)
from tinyctx.middleware.drop_nonessential import droppable_groups
from tinyctx.testing import assert_pairing_intact, strategies

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

    @given(strategies.histories(max_turns=14), st.integers(0, 12), needs)
    def test_properties_on_generated_histories(
        self, history: tuple[Message, ...], keep_recent: int, need: int | None
    ) -> None:
        relief = trim_oldest(history, keep_recent=keep_recent, need=need, counter=COUNTER)
        after = relief.messages
        assert_pairing_intact(after, history)
        _assert_systems_kept(history, after)
        n = len(history)
        assert after[len(after) - min(keep_recent, n) :] == history[n - min(keep_recent, n) :]
        removed = _removed(history, after)
        if removed:
            # what went is a head of the history (system messages aside), cut at a safe place
            last = max(i for i, m in enumerate(history) if any(m is r for r in removed))
            head = [m for m in history[: last + 1] if not isinstance(m, SystemMessage)]
            assert [id(m) for m in head] == [id(m) for m in removed]
            assert safe_boundaries(history)[last + 1]
        assert relief.freed_tokens == sum(COUNTER.count_message(m) for m in removed)
