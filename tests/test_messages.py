"""Messages are frozen and hashable; pairing rules name the first orphan."""

from __future__ import annotations

from types import MappingProxyType

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    Message,
    ModelRequest,
    PairingError,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.frozen import FrozenDict
from tinyctx.messages import (
    check_pairing,
    pending_tool_calls,
    safe_boundaries,
    snap_boundary,
    tool_turns,
)
from tinyctx.testing import assert_pairing_intact
from tinyctx.testing.strategies import histories


def _pairs_ok(head: tuple[Message, ...], tail: tuple[Message, ...]) -> bool:
    calls_in_head = {c.id for m in head if isinstance(m, AssistantMessage) for c in m.tool_calls}
    results_in_tail = {m.tool_call_id for m in tail if isinstance(m, ToolResult)}
    calls_in_tail = {c.id for m in tail if isinstance(m, AssistantMessage) for c in m.tool_calls}
    results_in_head = {m.tool_call_id for m in head if isinstance(m, ToolResult)}
    return not (calls_in_head & results_in_tail) and not (results_in_head & calls_in_tail)


class TestMessageValues:
    """Messages are immutable, hashable values with read-only metadata."""

    def test_frozen_hashable_and_equal_by_value(self) -> None:
        a = AssistantMessage(
            "hi", (ToolCall("c1", "search", {"q": ["x"]}),), metadata={"m": {"n": 1}}
        )
        b = AssistantMessage(
            "hi", [ToolCall("c1", "search", {"q": ["x"]})], metadata={"m": {"n": 1}}
        )
        assert a == b
        assert hash(a) == hash(b)
        assert {a, b} == {a}
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            a.content = "x"  # type: ignore[misc]
        assert isinstance(a.metadata, FrozenDict)
        assert a.tool_calls[0].arguments["q"] == ("x",)

    def test_evolve_returns_a_validated_copy(self) -> None:
        message = AssistantMessage("hi", metadata={"k": 1})
        changed = message.evolve(content="bye")
        assert changed == AssistantMessage("bye", metadata={"k": 1})
        assert message.content == "hi"
        with pytest.raises(TypeError):
            UserMessage("x").evolve(content=3)

    def test_roles_and_essential_flag(self) -> None:
        assert SystemMessage("s").role == "system"
        assert UserMessage("u", essential=False).essential is False
        assert AssistantMessage().role == "assistant"
        assert ToolResult("c", "r").role == "tool"

    @pytest.mark.parametrize(
        ("build", "match"),
        [
            (lambda: ToolCall("", "x"), "id must be a non-empty string"),
            (lambda: ToolCall("c", ""), "name must be a non-empty string"),
            (lambda: ToolResult("", "x"), "tool_call_id"),
            (lambda: UserMessage(3), "content"),  # type: ignore[arg-type]
            (lambda: AssistantMessage("", ("not a call",)), "ToolCall objects"),  # type: ignore[arg-type]
            (
                lambda: AssistantMessage("", (ToolCall("c", "a"), ToolCall("c", "b"))),
                "duplicate tool call id 'c'",
            ),
        ],
    )
    def test_bad_input_is_rejected_with_the_field(self, build, match: str) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises((ValueError, TypeError), match=match):
            build()


_SMALL_DICTS = st.dictionaries(st.sampled_from("abcde"), st.integers(), max_size=4)


class TestFrozenDictMerge:
    """``|`` gives a new FrozenDict with the right side winning, whatever mapping it is."""

    @given(left=_SMALL_DICTS, right=_SMALL_DICTS)
    def test_merging_frozen_plain_and_other_mappings(
        self, left: dict[str, int], right: dict[str, int]
    ) -> None:
        base = FrozenDict(left)
        for other in (FrozenDict(right), dict(right), MappingProxyType(dict(right))):
            merged = base | other
            assert type(merged) is FrozenDict and merged == {**left, **right}
            assert base == left and other == right  # neither side changed


class TestToolCallArguments:
    """A ToolCall's arguments are JSON, checked when the call is built."""

    @pytest.mark.parametrize(
        ("arguments", "where"),
        [
            ({"when": object()}, "'when'"),
            ({"paths": ["a", float("inf")]}, "'paths'"),
            ({"blob": b"bytes"}, "'blob'"),
            ({"nested": {"deep": {"x": 1j}}}, "'nested'"),
            ({"keys": {1: "int key"}}, "'keys'"),
        ],
    )
    def test_a_non_json_argument_fails_when_built_naming_call_and_argument(
        self, arguments: dict[str, object], where: str
    ) -> None:
        """The error names the call id, the tool and the argument at construction."""
        with pytest.raises(TypeError, match=f"ToolCall 'c7' \\(read\\): argument {where}"):
            ToolCall("c7", "read", arguments)

    def test_json_arguments_are_accepted_and_frozen(self) -> None:
        """Every JSON value (nested lists, objects, numbers, null) builds a call."""
        args = {"a": [1, 2.5, None, True, "s"], "b": {"c": {"d": []}}}
        call = ToolCall("c1", "t", args)
        assert call.arguments["b"]["c"]["d"] == ()


class TestPairing:
    """check_pairing names the first orphan; generated histories always pass."""

    def test_orphan_call_before_next_assistant(self) -> None:
        history = [
            UserMessage("u"),
            AssistantMessage("", (ToolCall("c1", "a"), ToolCall("c2", "b"))),
            ToolResult("c1", "r"),
            AssistantMessage("next"),
        ]
        with pytest.raises(PairingError, match="orphan tool call 'c2'") as info:
            check_pairing(history)
        assert info.value.index == 1
        assert info.value.tool_call_id == "c2"

    def test_orphan_and_duplicate_results(self) -> None:
        with pytest.raises(PairingError, match="index 1.*'zz' answers no tool call"):
            check_pairing([UserMessage("u"), ToolResult("zz", "r")])
        call = ToolCall("c1", "a")
        with pytest.raises(PairingError, match="already answered"):
            check_pairing(
                [AssistantMessage("", (call,)), ToolResult("c1", "r"), ToolResult("c1", "r")]
            )
        with pytest.raises(PairingError, match="duplicate tool call id"):
            check_pairing(
                [
                    AssistantMessage("", (call,)),
                    ToolResult("c1", "r"),
                    AssistantMessage("", (call,)),
                ]
            )

    def test_trailing_pending_calls_are_allowed_unless_strict(self) -> None:
        history = [UserMessage("u"), AssistantMessage("", (ToolCall("c1", "submit"),))]
        check_pairing(history)
        assert [c.id for c in pending_tool_calls(history)] == ["c1"]
        with pytest.raises(PairingError, match="'c1'.*has no result"):
            check_pairing(history, allow_pending=False)

    @given(history=histories(max_turns=10))
    def test_generated_histories_have_valid_pairing(self, history: tuple[Message, ...]) -> None:
        check_pairing(history, allow_pending=False)
        assert pending_tool_calls(history) == ()

    @given(history=histories(max_turns=10))
    def test_safe_boundaries_match_brute_force(self, history: tuple[Message, ...]) -> None:
        bounds = safe_boundaries(history)
        assert len(bounds) == len(history) + 1
        for i, ok in enumerate(bounds):
            head, tail = history[:i], history[i:]
            assert ok == _pairs_ok(head, tail), i
            if ok:
                assert_pairing_intact(tail)

    @given(history=histories(max_turns=10), data=st.data())
    def test_snap_boundary_lands_on_a_safe_cut(
        self, history: tuple[Message, ...], data: st.DataObject
    ) -> None:
        index = data.draw(st.integers(-2, len(history) + 2))
        bounds = safe_boundaries(history)
        back = snap_boundary(history, index)
        forward = snap_boundary(history, index, direction="forward")
        assert bounds[back] and bounds[forward]
        clamped = max(0, min(index, len(history)))
        assert back <= clamped <= forward
        assert not any(bounds[back + 1 : clamped + 1]) or back == clamped

    @given(history=histories(max_turns=10))
    def test_tool_turns_cover_every_call(self, history: tuple[Message, ...]) -> None:
        turns = tool_turns(history)
        calls = [c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls]
        assert [cid for t in turns for cid in t.call_ids] == calls
        for turn in turns:
            assert len(turn.result_indices) == len(turn.call_ids)
            assert all(i > turn.assistant_index for i in turn.result_indices)


class TestOnlyMessagesInARequest:
    """A model request, a conversation and a run's input hold messages only, checked fast."""

    @given(
        history=histories(),
        at=st.integers(min_value=0),
        stranger=st.sampled_from([{"role": "user"}, "text", None, 3]),
    )
    def test_a_stranger_anywhere_is_named_by_its_index(
        self, history: tuple[Message, ...], at: int, stranger: object
    ) -> None:
        """The first item that is not a Message is named, however long the history."""
        at %= len(history) + 1
        items = (*history[:at], stranger, *history[at:])
        with pytest.raises(TypeError, match=rf"messages\[{at}\] must be a Message"):
            ModelRequest(messages=items)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=rf"messages\[{at}\] must be a Message"):
            Conversation().replace(items)  # type: ignore[arg-type]

    def test_a_subclass_of_a_message_is_a_message(self) -> None:
        """Only the four built-in classes take the fast path; a subclass still passes."""

        @attrs.frozen
        class Note(UserMessage):
            pass

        request = ModelRequest(messages=(UserMessage("a"), Note("b")))
        assert [m.text for m in request.messages] == ["a", "b"]
