"""Summarization: the older history becomes one summary; failures change nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    DocumentPart,
    ImagePart,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.chain import compose
from tinyctx.conversation import Conversation
from tinyctx.events import ModelCallFinished
from tinyctx.messages import check_pairing, safe_boundaries
from tinyctx.middleware import (
    ExtractiveSummarizer,
    ModelSummarizer,
    SummarizationError,
    Summarize,
    Summarizer,
)
from tinyctx.middleware.policy import PressurePolicy
from tinyctx.middleware.summarize import (
    REFERENCES_HEADING,
    SummaryApplied,
    SummaryFailed,
    is_summary,
    render_transcript,
    summarize_history,
    summary_references,
    summary_split,
)
from tinyctx.parts import describe_part
from tinyctx.testing import (
    FakeTool,
    ScriptedModel,
    assert_pairing_intact,
    call,
    capture_events,
    reply,
    run_layer,
)
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter, default_counter

# a property needs no second backend: the trio run proves it, other tests cover asyncio
TRIO_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])


class Fixed:
    """A summarizer that answers ``text`` and records what it was asked to summarize."""

    def __init__(self, text: str = "the gist") -> None:
        self.text = text
        self.seen: list[tuple[Message, ...]] = []

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        self.seen.append(tuple(messages))
        return self.text


class Failing:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error or RuntimeError("provider down")
        self.calls = 0

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        self.calls += 1
        raise self.error


def tool_turn(index: int, results: int = 1, text: str = "found it") -> list[Message]:
    calls = tuple(ToolCall(f"c{index}_{k}", "search", {"q": index}) for k in range(results))
    return [AssistantMessage("", calls), *(ToolResult(c.id, text, c.name) for c in calls)]


def chat(pairs: int) -> list[Message]:
    out: list[Message] = []
    for index in range(pairs):
        out += [UserMessage(f"question {index}"), AssistantMessage(f"answer {index}")]
    return out


class TestSummarySplit:
    """Where the split falls: keep_recent back, moved so a call and its results stay together."""

    def test_not_longer_than_keep_recent_means_no_split(self) -> None:
        assert summary_split(tuple(chat(5)), keep_recent=10) is None
        assert summary_split(tuple(chat(5)), keep_recent=11) is None
        assert summary_split(tuple(chat(5)), keep_recent=9) == (0, 1)

    def test_a_multi_result_turn_is_never_split(self) -> None:
        # the seed's snap_split_forward was an `if` in disguise: it stepped past one result
        # of a turn, not all of them. Here the target falls between results 1 and 2 of 3.
        history = (UserMessage("go"), *tool_turn(0, results=3), *chat(2))
        #           0                  1 assistant, 2 3 4 results       5..8
        assert summary_split(history, keep_recent=6) == (0, 1)  # target 3 -> back to 1
        assert summary_split(history, keep_recent=4) == (0, 5)

    def test_keep_task_leaves_the_first_user_message_in_front(self) -> None:
        """With keep_task the first user message after the system messages is kept too."""
        history = (SystemMessage("a"), *chat(6))
        assert summary_split(history, keep_recent=4, keep_task=True) == (2, 9)
        earlier = UserMessage("[auto-compacted] ...", metadata={"tinyctx": {"summary": {}}})
        summarized = (SystemMessage("a"), earlier, *chat(3))  # a summary is no task
        assert summary_split(summarized, keep_recent=2, keep_task=True) == (1, 6)

    def test_forward_moves_past_a_turn_instead_of_keeping_it(self) -> None:
        """forward snaps the split to the next safe cut (more summarized, a shorter tail)."""
        history = (UserMessage("go"), *tool_turn(0, results=3), *chat(2))
        assert summary_split(history, keep_recent=6) == (0, 1)
        assert summary_split(history, keep_recent=6, forward=True) == (0, 5)
        turn_at_end = (*chat(2), *tool_turn(0, results=2))
        assert summary_split(turn_at_end, keep_recent=1, forward=True) == (0, 4)

    def test_leading_system_messages_are_not_summarized(self) -> None:
        history = (SystemMessage("a"), SystemMessage("b"), *chat(6))
        assert summary_split(history, keep_recent=4) == (2, 10)
        assert summary_split((SystemMessage("a"), *chat(1)), keep_recent=1) == (1, 2)
        assert summary_split((SystemMessage("a"), *chat(1)), keep_recent=2) is None

    def test_only_system_messages_before_the_tail_means_nothing_to_do(self) -> None:
        history = (UserMessage("u"), *tool_turn(0, results=5))
        assert summary_split(history, keep_recent=3) == (0, 1)
        history = (SystemMessage("a"), SystemMessage("b"), *tool_turn(0, results=4))
        assert summary_split(history, keep_recent=2) is None

    def test_pending_calls_at_the_end_are_never_summarized(self) -> None:
        history = (*chat(3), AssistantMessage("", (ToolCall("p1", "t"), ToolCall("p2", "t"))))
        history += (ToolResult("p1", "one", "t"),)
        # keep_recent=1 would cut between the pending call and its answered sibling
        assert summary_split(history, keep_recent=1) == (0, 6)

    @given(history=histories(), keep=st.integers(0, 8))
    def test_the_split_is_the_nearest_safe_cut_keeping_the_newest_messages(
        self, history: Any, keep: int
    ) -> None:
        plan = summary_split(history, keep_recent=keep)
        if plan is None:
            return
        lead, split = plan
        safe = safe_boundaries(history)
        assert safe[split] and lead < split <= len(history) - keep
        assert not any(safe[split + 1 : len(history) - keep + 1])
        assert all(isinstance(m, SystemMessage) for m in history[:lead])
        assert not isinstance(history[lead], SystemMessage)


class TestSummarizeHistory:
    """The head becomes one marked summary message; an empty or failing summary raises."""

    async def test_the_head_is_replaced_by_one_marked_summary(self) -> None:
        history = (SystemMessage("be brief"), *chat(4), *tool_turn(0, results=2), *chat(3))
        summarizer = Fixed("  User asked 4 questions; search found it.  ")
        new, stats = await summarize_history(history, summarizer, RunContext.new(), keep_recent=6)
        assert new[0] is history[0]
        summary = new[1]
        assert isinstance(summary, UserMessage) and is_summary(summary)
        assert summary.text == (
            "[auto-compacted] Summary of 11 earlier messages:\n"
            "User asked 4 questions; search found it."
        )
        assert summary.metadata["tinyctx"]["summary"] == {"messages": 11, "summarizer": "Fixed"}
        assert new[2:] == history[-6:]
        assert all(a is b for a, b in zip(new[2:], history[-6:], strict=True))
        assert summarizer.seen == [history[1:12]]
        assert (stats.summarized, stats.kept, stats.lead, stats.split) == (11, 7, 1, 12)
        counter = HeuristicCounter()
        assert stats.tokens_before == counter.count_messages(history)
        assert stats.tokens_after == counter.count_messages(new)
        check_pairing(new, allow_pending=False)

    async def test_nothing_to_summarize_means_no_summarizer_call(self) -> None:
        history = tuple(chat(5))
        summarizer = Failing()
        new, stats = await summarize_history(history, summarizer, RunContext.new(), keep_recent=10)
        assert new is history and summarizer.calls == 0
        assert not stats.changed and stats.kept == 10

    async def test_system_messages_inside_the_head_are_kept_verbatim(self) -> None:
        note = SystemMessage("the user now prefers French")
        history = (SystemMessage("root"), *chat(2), note, *chat(3))
        summarizer = Fixed()
        new, stats = await summarize_history(history, summarizer, RunContext.new(), keep_recent=4)
        assert new[:2] == (history[0], note)
        assert is_summary(new[2]) and new[3:] == history[-4:]
        assert note not in summarizer.seen[0] and stats.summarized == 6

    @pytest.mark.parametrize("text", ["", "   \n\t "])
    async def test_an_empty_summary_raises_and_changes_nothing(self, text: str) -> None:
        history = tuple(chat(8))
        copy = tuple(history)
        with pytest.raises(SummarizationError, match="empty summary"):
            await summarize_history(history, Fixed(text), RunContext.new(), keep_recent=4)
        assert history == copy

    async def test_a_failing_summarizer_raises_with_its_cause(self) -> None:
        failure = RuntimeError("provider down")
        with pytest.raises(SummarizationError, match="provider down") as info:
            await summarize_history(tuple(chat(8)), Failing(failure), RunContext.new(), 4)
        assert info.value.__cause__ is failure

    async def test_a_non_string_summary_is_a_failure(self) -> None:
        with pytest.raises(SummarizationError, match="expected str"):
            await summarize_history(tuple(chat(8)), Fixed(None), RunContext.new(), 4)  # type: ignore[arg-type]

    async def test_cancellation_propagates_as_itself(self) -> None:
        ctx = RunContext.new()

        class Hanging:
            async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
                await anyio.sleep_forever()
                return "never"

        async with anyio.create_task_group() as group:

            async def cancel_soon() -> None:
                await anyio.sleep(0.01)
                ctx.cancellation.cancel("user left")

            group.start_soon(cancel_soon)
            with pytest.raises(RunCancelled, match="user left"):
                await summarize_history(tuple(chat(8)), Hanging(), ctx, keep_recent=4)

    @TRIO_ONLY
    @given(history=histories(min_turns=1), keep=st.integers(0, 6))
    async def test_a_failing_summarizer_leaves_any_history_as_it_was(
        self, history: Any, keep: int
    ) -> None:
        ctx = RunContext.new(conversation=Conversation(history))
        snapshot = ctx.conversation.messages
        summarizer = Failing()
        try:
            new, stats = await summarize_history(history, summarizer, ctx, keep_recent=keep)
        except SummarizationError:
            assert summarizer.calls == 1
        else:
            assert summarizer.calls == 0 and new is history and not stats.changed
        assert ctx.conversation.messages is snapshot

    @TRIO_ONLY
    @given(history=histories(), keep=st.integers(0, 6), references=st.integers(0, 80))
    async def test_pairing_holds_and_the_tail_is_verbatim(
        self, history: Any, keep: int, references: int
    ) -> None:
        new, stats = await summarize_history(
            history,
            ExtractiveSummarizer(200),
            RunContext.new(),
            keep_recent=keep,
            references=references,
        )
        assert_pairing_intact(new, history)
        check_pairing(new, allow_pending=False)
        if stats.changed:
            tail = history[stats.split :]
            assert len(tail) >= keep and new[len(new) - len(tail) :] == tail
            assert sum(is_summary(m) for m in new) == 1 + sum(is_summary(m) for m in tail)
            system = [m for m in history[: stats.split] if isinstance(m, SystemMessage)]
            assert [m for m in new[: len(new) - len(tail)] if isinstance(m, SystemMessage)] == (
                system
            )


def reads(*results: str) -> list[Message]:
    """A task, then one read per result."""
    out: list[Message] = [UserMessage("fix the loader")]
    for index, text in enumerate(results):
        call = ToolCall(f"r{index}", "read", {"n": index})
        out += [AssistantMessage("", (call,)), ToolResult(call.id, text, "read")]
    return out


class TestSummaryReferences:
    """A span-carrying summary ends with the summarized spans it lacks, verbatim and bounded."""

    async def test_spans_the_summary_and_the_tail_lack_are_kept_newest_first(self) -> None:
        """Newest message first (by rule within one); spans the summary or the tail hold are out."""
        history = [
            *reads(
                "see src/app/config.py and 48213",
                "load_settings_v2 in src/app/loader.py",
                "tail_only_name",
            ),
            AssistantMessage("tail_only_name is it"),
        ]
        new, stats = await summarize_history(
            history, Fixed("about 48213"), RunContext.new(), keep_recent=1, references=60
        )
        summary = new[0]
        assert stats.changed and is_summary(summary)
        body = summary.text.split(f"{REFERENCES_HEADING}\n")[1]
        assert body.split(" ") == ["src/app/loader.py", "load_settings_v2", "src/app/config.py"]
        assert summary.metadata["tinyctx"]["summary"]["references"] == 3

    async def test_no_budget_no_section(self) -> None:
        """references=0 (the default) writes the summary as before."""
        history = [*reads("load_settings_v2"), AssistantMessage("done")]
        new, _ = await summarize_history(history, Fixed(), RunContext.new(), keep_recent=1)
        assert REFERENCES_HEADING not in new[0].text
        assert "references" not in new[0].metadata["tinyctx"]["summary"]

    @given(history=histories(), budget=st.integers(0, 120))
    def test_deterministic_and_within_the_budget(self, history: Any, budget: int) -> None:
        """The same messages give the same references, within ``budget`` tokens, each once."""
        counter = default_counter()
        first = summary_references(history, "", budget, counter)
        assert first == summary_references(tuple(history), "", budget, counter)
        assert len(set(first)) == len(first)
        if first:
            assert counter.count_text(f"{REFERENCES_HEADING}\n{' '.join(first)}") <= budget

    @TRIO_ONLY
    @given(history=histories(min_turns=1), keep=st.integers(0, 6))
    async def test_a_failed_summary_changes_nothing(self, history: Any, keep: int) -> None:
        """With references on, a failing summarizer still leaves the history as it was."""
        ctx = RunContext.new(conversation=Conversation(history))
        snapshot = ctx.conversation.messages
        try:
            new, _ = await summarize_history(
                history, Failing(), ctx, keep_recent=keep, references=100
            )
        except SummarizationError:
            pass
        else:
            assert new is history
        assert ctx.conversation.messages is snapshot

    def test_the_layer_option_is_a_share_of_the_summary_budget(self) -> None:
        """Summarize(references=f) gives f of the summarizer's max_tokens; bad values refused."""
        assert Summarize(ExtractiveSummarizer(1000), references=0.1).reference_tokens() == 100
        assert Summarize(Fixed(), references=0.1).reference_tokens() == 102
        assert Summarize(Fixed()).reference_tokens() == 0
        for bad in (0, 1.5, "a"):
            with pytest.raises(ConfigError, match="Summarize.references"):
                Summarize(Fixed(), references=bad)


def transcript_history() -> tuple[Message, ...]:
    return (
        UserMessage("Find why the build fails and fix it."),
        AssistantMessage("Looking.", (ToolCall("c1", "bash", {"cmd": "make"}),)),
        ToolResult("c1", "error: missing header foo.h\nmake: *** [all] Error 1", "bash", True),
        AssistantMessage("The header is missing; adding it."),
        *[
            m
            for i in range(40)
            for m in (UserMessage(f"filler question {i} " * 20), AssistantMessage("ok " * 40))
        ],
        UserMessage("Also update the changelog."),
        AssistantMessage("Done with the fix; changelog next."),
    )


class TestModelSummarizer:
    """Asks a model, through call_model, with a child context and a dense-summary prompt."""

    async def test_the_request_and_the_child_context(self) -> None:
        model = ScriptedModel([reply("Goal: fix build. Found: foo.h missing.", usage=(500, 20))])
        ctx = RunContext.new(RunConfig(model="gpt-4o"))
        summarizer = ModelSummarizer(model)
        history = transcript_history()[:4]
        with capture_events() as events:
            text = await summarizer.summarize(history, ctx)
        assert text == "Goal: fix build. Found: foo.h missing."
        (request,) = model.requests
        assert request.tools == () and request.model == "gpt-4o"
        prompt = request.system_prompt or ""
        for keeps in ("goals", "decisions", "facts found through tools", "open work"):
            assert keeps in prompt
        (message,) = request.messages
        body = message.text
        assert "Summarize these 4 earlier messages" in body
        assert "[user] Find why the build fails and fix it." in body
        assert '[assistant calls bash] {"cmd": "make"}' in body
        assert "[tool result bash (error)] error: missing header foo.h" in body
        child = model.contexts[0]
        assert child.parent_run_id == ctx.run_id and child.depth == ctx.depth + 1
        assert "tinyctx:summarize" in child.tags
        assert child.conversation is not ctx.conversation
        assert ctx.usage.total() == Usage(500, 20)
        (finished,) = [e for e in events if isinstance(e, ModelCallFinished)]
        assert finished.run_id == child.run_id and finished.input_tokens == 500

    async def test_an_oversized_transcript_loses_its_middle_not_its_end(self) -> None:
        history = transcript_history()
        model = ScriptedModel(["summary"])
        await ModelSummarizer(model, max_transcript_tokens=600).summarize(history, RunContext.new())
        body = model.requests[0].messages[0].text
        assert "Find why the build fails" in body  # the goal, at the start
        assert "Done with the fix; changelog next." in body  # the newest statement
        assert "messages omitted from the middle" in body
        assert "filler question 20" not in body
        assert HeuristicCounter().count_text(body) < 800

    def test_the_run_window_caps_the_transcript(self) -> None:
        summarizer = ModelSummarizer(ScriptedModel(), max_transcript_tokens=100_000)
        ctx = RunContext.new(RunConfig(max_tokens=1000))
        body = summarizer.request_for(transcript_history(), ctx).messages[0].text
        assert HeuristicCounter().count_text(body) < 1000

    async def test_model_failures_and_empty_answers_become_summarization_errors(self) -> None:
        history = (*chat(6),)
        for script, match in (
            ([RuntimeError("rate limited")], "rate limited"),
            ([reply("", call("search"))], "empty summary"),
            (["  "], "empty summary"),
        ):
            summarizer = ModelSummarizer(ScriptedModel(script))
            with pytest.raises(SummarizationError, match=match):
                await summarize_history(history, summarizer, RunContext.new(), keep_recent=2)

    def test_bad_config(self) -> None:
        with pytest.raises(ConfigError, match="ModelSummarizer.model"):
            ModelSummarizer("gpt-4o")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="ModelSummarizer.prompt"):
            ModelSummarizer(ScriptedModel(), prompt=" ")
        with pytest.raises(ConfigError, match="ModelSummarizer.max_transcript_tokens"):
            ModelSummarizer(ScriptedModel(), max_transcript_tokens=10)

    def test_render_transcript_keeps_the_first_and_last_message_even_when_huge(self) -> None:
        history = (
            UserMessage("GOAL " + "a" * 50_000),
            *chat(3),
            UserMessage("b" * 50_000 + " END"),
        )
        text = render_transcript(history, max_tokens=500)
        assert text.startswith("[user] GOAL") and text.endswith("END")
        assert HeuristicCounter().count_text(text) <= 520


SIGNED_URL = (
    "https://bucket.example.com/uploads/2026/12/screenshot-of-the-failing-build.png"
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261201%2Fus-east-1"
    "&X-Amz-Expires=3600&X-Amz-Signature=" + "f" * 64
)


class TestMediaInTheSummaryPrompt:
    """Images and documents from a URL are named with the URL whole (a signed URL cut short
    could not be fetched again); their text around may still be cut."""

    async def test_a_long_image_url_reaches_the_summarizer_whole(self) -> None:
        """A 250-character signed URL in a user message and a tool result stays whole."""
        image = ImagePart(url=SIGNED_URL, label="screenshot")
        document = DocumentPart(url=SIGNED_URL.replace(".png", ".pdf"), title="log.pdf")
        history = (
            UserMessage((TextPart("Why does it fail?"), image)),
            AssistantMessage("", (ToolCall("c1", "fetch", {"what": "log"}),)),
            ToolResult("c1", (TextPart("the log:"), document), "fetch"),
            AssistantMessage("It is the header."),
        )
        model = ScriptedModel(["summary"])
        await ModelSummarizer(model).summarize(history, RunContext.new())
        body = model.requests[0].messages[0].text
        assert f"[image: screenshot from {SIGNED_URL}]" in body
        assert f"[document: log.pdf from {SIGNED_URL.replace('.png', '.pdf')}]" in body

    def test_text_beside_a_url_is_still_cut_and_the_url_kept(self) -> None:
        """A huge text part is cut in its middle; the image after it keeps its URL."""
        message = UserMessage((TextPart("x" * 20_000), ImagePart(url=SIGNED_URL)))
        text = render_transcript((message,), max_tokens=100_000, block_chars=2000)
        assert "characters omitted" in text
        assert text.endswith(f"[image: from {SIGNED_URL}]")
        assert len(text) < 2000 + len(SIGNED_URL) + 100

    def test_the_extractive_summary_keeps_urls_whole(self) -> None:
        """ExtractiveSummarizer names a user's image and a tool's document with the URL."""
        history = (
            UserMessage((TextPart("first goal"),)),
            UserMessage((TextPart("look " * 100), ImagePart(url=SIGNED_URL))),
            AssistantMessage("", (ToolCall("c1", "fetch", {}),)),
            ToolResult("c1", (TextPart("got it"), DocumentPart(url=SIGNED_URL)), "fetch"),
            AssistantMessage("Read both."),
        )
        summary = ExtractiveSummarizer(max_tokens=4000).extract(history)
        assert f"[image: from {SIGNED_URL}]" in summary
        assert f"fetch({{}}) -> got it | [document: from {SIGNED_URL}]" in summary

    def test_a_data_url_is_never_spelled_out(self) -> None:
        """A part built from a URL that is a data: URL is named by its start only."""
        assert describe_part(ImagePart(url="data:," + "A" * 1000)).endswith("(1006 chars)]")


class TestExtractiveSummarizer:
    """Offline and deterministic: goals, tool calls, first result lines, last statements."""

    async def test_keeps_what_matters(self) -> None:
        history = transcript_history()[:4] + (
            UserMessage("extra context", essential=False),
            UserMessage("Also update the changelog."),
            AssistantMessage("Done with the fix; changelog next."),
        )
        text = await ExtractiveSummarizer().summarize(history, RunContext.new())
        assert "User goals:\n- Find why the build fails and fix it." in text
        assert "- Also update the changelog." in text
        assert "extra context" not in text  # retrieved, non-essential context is not a goal
        assert 'bash({"cmd": "make"}) -> error: error: missing header foo.h | make:' in text
        assert "Last assistant statements:" in text
        assert "- Done with the fix; changelog next." in text

    async def test_deterministic(self) -> None:
        history = transcript_history()
        first = ExtractiveSummarizer(300).extract(history)
        assert first == ExtractiveSummarizer(300).extract(tuple(history))
        assert first == await ExtractiveSummarizer(300).summarize(history, RunContext.new())

    def test_stays_within_its_budget_and_says_what_it_left_out(self) -> None:
        history = transcript_history() + tuple(m for i in range(30) for m in tool_turn(i))
        text = ExtractiveSummarizer(max_tokens=150).extract(history)
        assert HeuristicCounter().count_text(text) <= 150
        assert "more not shown" in text
        assert "Find why the build fails" in text  # the first goal earns its place first

    def test_rolls_up_an_earlier_summary(self) -> None:
        earlier = UserMessage(
            "[auto-compacted] Summary of 50 earlier messages:\nThe user wants a CLI in Rust.",
            metadata={"tinyctx": {"summary": {"messages": 50}}},
        )
        text = ExtractiveSummarizer().extract((earlier, *chat(2)))
        assert text.startswith("Earlier summary:\n- The user wants a CLI in Rust.")

    def test_never_empty(self) -> None:
        assert ExtractiveSummarizer().extract((UserMessage(""), AssistantMessage(" ")))
        assert ExtractiveSummarizer(16).extract((UserMessage("x" * 5000),))

    def test_cleared_results_are_not_presented_as_results(self) -> None:
        history = (
            AssistantMessage("", (ToolCall("a", "fetch", {"url": "u"}),)),
            ToolResult(
                "a",
                "[Old tool result content cleared]",
                "fetch",
                metadata={"tinyctx": {"cleared": {"by": "microcompact"}}},
            ),
        )
        assert 'fetch({"url": "u"}) -> (result cleared earlier)' in ExtractiveSummarizer().extract(
            history
        )

    @given(history=histories(min_turns=1), budget=st.integers(16, 300))
    def test_any_history_fits_the_budget(self, history: Any, budget: int) -> None:
        text = ExtractiveSummarizer(max_tokens=budget).extract(history)
        assert text.strip()
        assert HeuristicCounter().count_text(text) <= max(budget, 16)

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"max_tokens": 3}, "max_tokens"),
            ({"line_chars": 0}, "line_chars"),
            ({"statements": -1}, "statements"),
        ],
    )
    def test_bad_config(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError, match=f"ExtractiveSummarizer.{field}"):
            ExtractiveSummarizer(**kwargs)


def long_history() -> tuple[Message, ...]:
    return (
        SystemMessage("sys"),
        *[m for i in range(12) for m in (UserMessage(f"q{i} " * 30), *tool_turn(i, 2, "r " * 40))],
    )


class TestSummarizeLayer:
    """Summarizes over the trigger, persists once, reports failures and backs off."""

    def test_is_a_summarizer_protocol_and_a_pressure_policy(self) -> None:
        assert isinstance(Fixed(), Summarizer)
        assert isinstance(ExtractiveSummarizer(), Summarizer)
        assert isinstance(ModelSummarizer(ScriptedModel()), Summarizer)
        assert isinstance(Summarize(Fixed(), trigger_tokens=10), PressurePolicy)

    async def test_below_the_trigger_nothing_happens(self) -> None:
        summarizer = Fixed()
        ctx = RunContext.new(conversation=Conversation(long_history()))
        request = ModelRequest(messages=ctx.conversation.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        await run_layer(Summarize(summarizer, trigger_tokens=10**6), request, ctx, model)
        assert model.requests[0] is request and summarizer.seen == []

    async def test_over_the_trigger_it_summarizes_and_persists_once(self) -> None:
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        seen: list[Message] = []

        async def subscriber(message: Message, usage: Usage | None) -> None:
            seen.append(message)

        ctx.conversation.subscribe(subscriber)
        layer = Summarize(Fixed(), trigger_tokens=100, keep_recent=6)
        model = ScriptedModel(["ok"], repeat_last=True)
        with capture_events() as events:
            await run_layer(layer, ModelRequest(messages=ctx.conversation.messages), ctx, model)
        sent = model.requests[0].messages
        assert sent is ctx.conversation.messages
        assert sent[0] == history[0] and is_summary(sent[1]) and sent[2:] == history[-7:]
        assert await ctx.conversation.flush() == 1 and seen == [sent[1]]
        (event,) = [e for e in events if isinstance(e, SummaryApplied)]
        assert event.kind == "compaction.summary" and event.persisted
        assert (event.summarized, event.summarizer) == (len(history) - 8, "Fixed")
        assert event.tokens_after < event.tokens_before

    async def test_transient_summary_leaves_the_conversation_alone(self) -> None:
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        model = ScriptedModel(["ok"], repeat_last=True)
        layer = Summarize(Fixed(), trigger_tokens=100, keep_recent=6, persist=False)
        await run_layer(layer, ModelRequest(messages=history), ctx, model)
        assert ctx.conversation.messages == history and ctx.conversation.queued_events == 0
        assert is_summary(model.requests[0].messages[1])

    async def test_a_failure_is_reported_and_the_call_goes_on_unchanged(self) -> None:
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        request = ModelRequest(messages=ctx.conversation.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        with capture_events() as events:
            await run_layer(Summarize(Failing(), trigger_tokens=100), request, ctx, model)
        assert model.requests[0] is request
        assert ctx.conversation.messages is request.messages
        (failed,) = [e for e in events if isinstance(e, SummaryFailed)]
        assert failed.level == "warning" and "provider down" in failed.error
        assert (failed.consecutive_failures, failed.disabled) == (1, False)
        assert not [e for e in events if isinstance(e, SummaryApplied)]

    async def test_a_summary_that_does_not_shrink_the_history_is_refused(self) -> None:
        """A long summary is a SummaryFailed: history and request stay as they were."""
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        request = ModelRequest(messages=ctx.conversation.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        huge = Fixed("an endless summary " * 5000)
        layer = Summarize(huge, trigger_tokens=100, keep_recent=6)
        with capture_events() as events:
            await run_layer(layer, request, ctx, model)
        assert huge.seen  # it was asked
        assert model.requests[0] is request
        assert ctx.conversation.messages is request.messages
        assert ctx.conversation.queued_events == 0
        (failed,) = [e for e in events if isinstance(e, SummaryFailed)]
        assert "would not shrink the history" in failed.error
        assert failed.consecutive_failures == 1
        assert not [e for e in events if isinstance(e, SummaryApplied)]

    async def test_after_three_failures_it_stops_trying_and_a_success_resets(self) -> None:
        failing = Failing()
        layer = Summarize(failing, trigger_tokens=100, keep_recent=6, persist=False)
        ctx = RunContext.new()
        request = ModelRequest(messages=long_history())
        with capture_events() as events:
            for _ in range(5):
                await run_layer(layer, request, ctx)
        assert failing.calls == 3
        assert [e.disabled for e in events if isinstance(e, SummaryFailed)] == [False, False, True]
        other = RunContext.new()  # another session has its own count
        await run_layer(layer, request, other)
        assert failing.calls == 4

        class Flaky:
            def __init__(self) -> None:
                self.calls = 0

            async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
                self.calls += 1
                if self.calls in (1, 2, 4, 5):
                    raise RuntimeError("flaky")
                return "ok"

        flaky = Flaky()
        layer = Summarize(flaky, trigger_tokens=100, keep_recent=6, persist=False)
        ctx = RunContext.new()  # layer state is keyed by name: a fresh thread for this one
        for _ in range(6):
            await run_layer(layer, request, ctx)
        assert flaky.calls == 6  # the success at call 3 reset the count

    async def test_nothing_is_committed_or_reported_before_the_summary_returns(self) -> None:
        # the seed marked its extraction complete before the work ended; here the summary is
        # committed and reported only once the summarizer has returned
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        snapshot = ctx.conversation.messages
        observed: list[bool] = []

        with capture_events() as events:

            class Watching:
                async def summarize(
                    self, messages: Sequence[Message], ctx_: RunContext[Any]
                ) -> str:
                    observed.append(ctx.conversation.messages is snapshot)
                    observed.append(not [e for e in events if isinstance(e, SummaryApplied)])
                    await anyio.lowlevel.checkpoint()
                    observed.append(ctx.conversation.messages is snapshot)
                    return "done"

            layer = Summarize(Watching(), trigger_tokens=100, keep_recent=6)
            await run_layer(layer, ModelRequest(messages=snapshot), ctx)
        assert observed == [True, True, True]
        assert is_summary(ctx.conversation.messages[1])
        assert [e.kind for e in events if isinstance(e, SummaryApplied)] == ["compaction.summary"]

    async def test_an_open_breaker_and_a_quiet_trigger_do_no_work(self) -> None:
        class Spy(HeuristicCounter):
            def __init__(self) -> None:
                super().__init__()
                self.requests = 0

            def count_request(self, request: ModelRequest) -> int:
                self.requests += 1
                return super().count_request(request)

        spy = Spy()
        failing = Failing()
        layer = Summarize(failing, trigger_tokens=100, keep_recent=6, persist=False, counter=spy)
        ctx = RunContext.new()
        request = ModelRequest(messages=long_history())
        for _ in range(3):
            await run_layer(layer, request, ctx)
        assert (spy.requests, failing.calls) == (3, 3)
        for _ in range(4):  # open: not even the estimate is taken
            await run_layer(layer, request, ctx)
        assert (spy.requests, failing.calls) == (3, 3)
        quiet = Summarize(failing, trigger_tokens=10**9, counter=spy)
        await run_layer(quiet, request, RunContext.new())
        assert (spy.requests, failing.calls) == (4, 3)  # below the trigger: one estimate only

    async def test_trigger_defaults_to_a_request_that_would_not_fit(self) -> None:
        """By default the layer summarizes only a request over the usable window (so a
        conversation that fits is never rewritten); an unknown window is an error."""
        layer = Summarize(Fixed())
        ctx = RunContext.new(RunConfig(max_tokens=10_000, reserved_output_tokens=2_000))
        assert layer.trigger_for(ctx) == 8_001
        history = long_history()
        tokens = default_counter().count_request(ModelRequest(messages=history))
        for window, fires in ((tokens, False), (tokens - 1, True)):
            model = ScriptedModel(["ok"])
            fitted = RunContext.new(
                RunConfig(max_tokens=window), conversation=Conversation(history)
            )
            await run_layer(layer, ModelRequest(messages=history), fitted, model)
            assert (model.requests[0].messages is history) is not fires
        with pytest.raises(ConfigError, match="Summarize.trigger_tokens"):
            await run_layer(layer, ModelRequest(messages=long_history()), RunContext.new())

    async def test_persist_maps_back_when_an_outer_layer_injected_messages(self) -> None:
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        injected = UserMessage("retrieved: docs", essential=False)

        async def inject(
            request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
        ) -> ModelResponse:
            messages = request.messages
            return await call_next(
                request.evolve(messages=(*messages[:1], injected, *messages[1:])), ctx
            )

        model = ScriptedModel(["ok"], repeat_last=True)
        onion = compose([inject, Summarize(Fixed(), trigger_tokens=100, keep_recent=6)], model)
        await onion(ModelRequest(messages=ctx.conversation.messages), ctx)
        conversation = ctx.conversation.messages
        assert injected not in conversation
        assert conversation[0] == history[0] and is_summary(conversation[1])
        assert conversation[2:] == history[-7:]
        check_pairing(conversation, allow_pending=False)

    async def test_relieve_reports_failure_and_leaves_the_history(self) -> None:
        history = long_history()
        ctx = RunContext.new(conversation=Conversation(history))
        counter = HeuristicCounter()
        relief = await Summarize(Failing(), trigger_tokens=10**9).relieve(
            history, ctx, counter, need=100
        )
        assert relief.messages is history and relief.freed_tokens == 0
        assert relief.detail["failed"] is True and "provider down" in relief.detail["error"]
        good = await Summarize(Fixed(), trigger_tokens=10**9, keep_recent=4).relieve(
            history, ctx, counter, need=100
        )
        assert not good.detail["failed"] and good.detail["applied"]
        assert good.freed_tokens == counter.count_messages(history) - counter.count_messages(
            good.messages
        )
        assert ctx.conversation.messages is not good.messages
        assert ctx.conversation.messages == history

    async def test_relieve_keeps_the_history_when_the_summary_is_not_smaller(self) -> None:
        history = tuple(chat(3))
        relief = await Summarize(Fixed("a much longer summary " * 20), keep_recent=2).relieve(
            history, RunContext.new(), HeuristicCounter(), need=1
        )
        assert relief.messages is history and relief.detail["applied"] is False

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"summarizer": "gpt"}, "summarizer"),
            ({"trigger_tokens": 0}, "trigger_tokens"),
            ({"keep_recent": -1}, "keep_recent"),
            ({"persist": 1}, "persist"),
            ({"max_failures": -1}, "max_failures"),
        ],
    )
    def test_bad_config(self, kwargs: dict[str, Any], field: str) -> None:
        arguments: dict[str, Any] = {"summarizer": Fixed(), **kwargs}
        with pytest.raises(ConfigError, match=f"Summarize.{field}"):
            Summarize(**arguments)

    async def test_in_a_session_with_a_model_summarizer(self) -> None:
        tool = FakeTool("search", returns="result " * 60)
        summary_model = ScriptedModel(["Goal: research. Found: results."], repeat_last=True)
        script = [reply(f"step {i}", call("search", q=i)) for i in range(8)] + ["done"]
        model = ScriptedModel(script)
        layer = Summarize(ModelSummarizer(summary_model), trigger_tokens=400, keep_recent=4)
        agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
        async with Session(agent) as session:
            result = await session.run("research this")
        assert result.final_text == "done"
        assert summary_model.calls >= 1
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
        final = session.conversation_messages
        check_pairing(final, allow_pending=False)
        assert is_summary(final[0])
        assert "Goal: research." in final[0].text

    async def test_a_hanging_summary_is_cancelled_with_the_session(self) -> None:
        summarizing = anyio.Event()

        async def hang(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            summarizing.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        summary_model = ScriptedModel([hang])
        tool = FakeTool("search", returns="result " * 60)
        model = ScriptedModel([reply("", call("search")) for _ in range(3)] + ["done"])
        layer = Summarize(ModelSummarizer(summary_model), trigger_tokens=50, keep_recent=2)
        agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
        async with Session(agent) as session:
            before: tuple[Message, ...] = ()

            async def cancel_when_summarizing() -> None:
                nonlocal before
                await summarizing.wait()
                before = session.conversation_messages
                session.cancel("stop")

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_when_summarizing)
                with pytest.raises(RunCancelled):
                    await session.run("go")
        assert before and session.conversation_messages[: len(before)] == before
        check_pairing(session.conversation_messages, allow_pending=False)


class TestKeepTaskAsAPolicy:
    """default_stack's summary keeps the task in front and frees what the guard asks for."""

    async def test_relief_keeps_the_task_and_meets_the_need(self) -> None:
        """The first user message survives the relief verbatim, ahead of the summary, and the
        history shrinks by at least the need (no trim left to finish the job)."""
        history = long_history()
        counter = default_counter()
        layer = Summarize(ExtractiveSummarizer(max_tokens=200), keep_task=True, counter=counter)
        need = counter.count_messages(history) // 2
        ctx = RunContext.new(conversation=Conversation(history))
        relief = await layer.relieve(history, ctx, counter, need=need)
        new = relief.messages
        assert new[:2] == history[:2] and is_summary(new[2])
        assert counter.count_messages(history) - counter.count_messages(new) >= need
        check_pairing(new)

    async def test_the_task_is_measured_against_the_window_not_what_is_left(self) -> None:
        """A task within an eighth of the usable window stays in front even when earlier
        policies left a history shorter than eight times it: summarizing it alone would
        rewrite the prompt from the task on, breaking the cached prefix it anchors."""
        task = UserMessage("the task " * 150)
        history = (SystemMessage("sys"), task, *long_history()[7:])
        counter = default_counter()
        assert counter.count_message(task) * 8 > counter.count_messages(history)
        layer = Summarize(Fixed(), keep_task=True, counter=counter)
        window = counter.count_message(task) * 8 + 2_000
        config = RunConfig(max_tokens=window, reserved_output_tokens=2_000)
        ctx = RunContext.new(config, conversation=Conversation(history))
        relief = await layer.relieve(history, ctx, counter, need=200)
        assert relief.messages[:2] == history[:2] and is_summary(relief.messages[2])
        # the same history without a known window: the history is the measure
        bare = RunContext.new(conversation=Conversation(history))
        relief = await layer.relieve(history, bare, counter, need=200)
        assert is_summary(relief.messages[1])

    async def test_a_task_over_an_eighth_of_the_window_is_summarized(self) -> None:
        """However long the history, a task over an eighth of the usable window is
        summarized like the rest."""
        task = UserMessage("the task " * 40)
        history = (SystemMessage("sys"), task, *long_history()[1:])
        counter = default_counter()
        assert counter.count_message(task) * 8 <= counter.count_messages(history)
        layer = Summarize(Fixed(), keep_task=True, counter=counter)
        config = RunConfig(max_tokens=counter.count_message(task) * 8 - 1)
        ctx = RunContext.new(config, conversation=Conversation(history))
        relief = await layer.relieve(history, ctx, counter, need=200)
        assert is_summary(relief.messages[1])

    async def test_on_its_own_trigger_the_history_is_the_measure(self) -> None:
        """Fired by its own (low) trigger, the layer keeps measuring the task against the
        history: a task kept there would leave the history near the trigger, summarized
        again at every call, however large the window."""
        task = UserMessage("the task " * 150)
        history = (SystemMessage("sys"), task, *long_history()[7:])
        counter = default_counter()
        assert counter.count_message(task) * 8 > counter.count_messages(history)
        summarizer = Fixed()
        layer = Summarize(summarizer, trigger_tokens=100, keep_recent=2, keep_task=True)
        config = RunConfig(max_tokens=1_000_000)
        ctx = RunContext.new(config, conversation=Conversation(history))
        model = ScriptedModel(["ok"])
        await run_layer(layer, ModelRequest(messages=history), ctx, model)
        assert summarizer.seen[0][0] == task and is_summary(model.requests[0].messages[1])

    async def test_a_long_first_message_is_summarized_like_the_rest(self) -> None:
        """A first user message over an eighth of the history is not kept in front."""
        history = (SystemMessage("sys"), UserMessage("pasted " * 2000), *long_history()[1:])
        counter = default_counter()
        layer = Summarize(Fixed(), keep_task=True, counter=counter)
        ctx = RunContext.new(conversation=Conversation(history))
        relief = await layer.relieve(history, ctx, counter, need=1000)
        assert is_summary(relief.messages[1])
