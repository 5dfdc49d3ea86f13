"""The local summary split chooses exactly the cut the whole-history scan chose."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from tinyctx.messages import check_pairing, snap_boundary
from tinyctx.middleware.summarize import is_summary, summary_split
from tinyctx.testing.strategies import histories


def reference_split(
    history: Sequence[Message],
    keep_recent: int,
    *,
    keep_task: bool,
    forward: bool,
    keep_summaries: int,
) -> tuple[int, int] | None:
    """The split as it was before the local walk: safe boundaries of the tail slice."""
    count = len(history)
    if count <= keep_recent:
        return None
    lead = 0
    while lead < count and isinstance(history[lead], SystemMessage):
        lead += 1
    if (
        keep_task
        and lead < count
        and isinstance(history[lead], UserMessage)
        and not is_summary(history[lead])
    ):
        lead += 1
    end = lead
    while end < count and is_summary(history[end]):
        end += 1
    lead, fold = (end, end) if end - lead <= keep_summaries else (lead, end)
    target = max(count - keep_recent, fold)
    if target <= lead:
        return None
    if forward:
        ahead = snap_boundary(history, target, direction="forward")
        if ahead < count:
            target = ahead
    window = target - 1
    while window >= 0 and not isinstance(history[window], AssistantMessage):
        window -= 1
    split = target
    if window >= 0:
        split = window + snap_boundary(history[window:], target - window, direction="backward")
    for index in range(lead, split):
        if not isinstance(history[index], SystemMessage):
            return lead, split
    return None


SUMMARY = UserMessage("[auto-compacted] ...", metadata={"tinyctx": {"summary": {}}})


@st.composite
def paired_histories(draw: st.DrawFn) -> tuple[Message, ...]:
    """System, user and summary messages and tool turns whose results follow their call in
    any order before the next assistant message; the last turn may still wait for some."""
    out: list[Message] = []
    for turn in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(("system", "user", "summary", "text", "tools")))
        if kind == "tools":
            calls = tuple(ToolCall(f"t{turn}_{k}", "t") for k in range(draw(st.integers(1, 3))))
            out.append(AssistantMessage("", calls))
            answered = draw(st.permutations(calls))
            out += [ToolResult(call.id, "r", "t") for call in answered]
        else:
            plain = {"system": SystemMessage("s"), "user": UserMessage("u"), "summary": SUMMARY}
            out.append(plain.get(kind, AssistantMessage("a")))
    if draw(st.booleans()):
        calls = tuple(ToolCall(f"p{k}", "t") for k in range(draw(st.integers(1, 3))))
        out.append(AssistantMessage("", calls))
        out += [ToolResult(c.id, "r", "t") for c in calls[: draw(st.integers(0, len(calls)))]]
    return tuple(out)


class TestSplitMatchesTheReference:
    """The split walks only near its target and still picks the old whole-scan cut on
    every paired history (the pairing every session history keeps)."""

    @given(
        history=st.one_of(histories(), paired_histories()),
        keep=st.integers(0, 12),
        keep_task=st.booleans(),
        forward=st.booleans(),
        keep_summaries=st.integers(0, 2),
    )
    def test_same_cut_as_the_whole_scan(
        self,
        history: tuple[Message, ...],
        keep: int,
        keep_task: bool,
        forward: bool,
        keep_summaries: int,
    ) -> None:
        check_pairing(history)
        new = summary_split(
            history, keep, keep_task=keep_task, forward=forward, keep_summaries=keep_summaries
        )
        old = reference_split(
            history, keep, keep_task=keep_task, forward=forward, keep_summaries=keep_summaries
        )
        assert new == old

    def test_a_turn_straddling_the_target_at_the_start_means_no_split(self) -> None:
        calls = (ToolCall("x", "t"), ToolCall("y", "t"))
        history = (AssistantMessage("", calls), ToolResult("x", "r", "t"), ToolResult("y", "r"))
        assert summary_split(history, 1) is None
        assert reference_split(history, 1, keep_task=False, forward=False, keep_summaries=0) is None
