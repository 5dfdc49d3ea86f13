"""Compaction that understands media: old images cleared first, named, paired, never growing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    ImagePart,
    Message,
    ModelRequest,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.messages import check_pairing
from tinyctx.middleware import BudgetGuard, ClearOldImages, ExtractiveSummarizer, Microcompact
from tinyctx.middleware.budget import ContextPolicyApplied
from tinyctx.middleware.extractors import render_transcript
from tinyctx.middleware.images import ImagesCleared, clear_images_history
from tinyctx.middleware.microcompact import microcompact_history
from tinyctx.parts import media_parts
from tinyctx.testing import ScriptedModel, capture_events, quiet_context, reply, run_layer
from tinyctx.testing.images import image_part
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

COUNTER = HeuristicCounter()


def _images(history: tuple[Message, ...]) -> list[ImagePart]:
    return [
        p
        for m in history
        if isinstance(m, (UserMessage, ToolResult))
        for p in media_parts(m.content)
        if isinstance(p, ImagePart)
    ]


def computer_use(steps: int) -> tuple[Message, ...]:
    """A computer-use run: each step a click and a screenshot result with a caption."""
    out: list[Message] = [UserMessage("Book a flight to Lisbon.")]
    for step in range(steps):
        call = ToolCall(f"call_{step}", "computer", {"action": "click", "x": step})
        shot = image_part(1280, 800, "image/jpeg", label="screenshot")
        out.append(AssistantMessage(f"Step {step}.", (call,)))
        out.append(ToolResult.for_call(call, [TextPart(f"clicked {step}"), shot]))
    return tuple(out)


class TestClearImagesHistory:
    """The pure function keeps the newest images and names the rest."""

    def test_keeps_the_newest_and_names_the_rest(self) -> None:
        """Older screenshots become ``[image cleared: screenshot 1280×800]``."""
        history = computer_use(5)
        new, stats = clear_images_history(history, 3, counter=COUNTER)
        assert stats.images_cleared == 2 and stats.messages_changed == 2
        assert _images(new) == _images(history)[-3:]
        assert new[2].content == "clicked 0\n[image cleared: screenshot 1280×800]"
        assert new[2].metadata["tinyctx"]["images_cleared"]["count"] == 1
        assert stats.freed_tokens == COUNTER.count_messages(history) - COUNTER.count_messages(new)

    def test_user_images_count_too(self) -> None:
        """A pasted image in a user message is one of the newest N like any screenshot."""
        pasted = UserMessage([TextPart("like this"), image_part(800, 600, label="mockup")])
        history = (*computer_use(2), pasted)
        new, _ = clear_images_history(history, 1, counter=COUNTER)
        assert _images(new) == [pasted.content[1]]
        assert new[-1] is pasted

    def test_an_image_only_result_becomes_its_placeholder_text(self) -> None:
        """With no media left, the content is plain text (what formats read back)."""
        call = ToolCall("c", "shot")
        history = (
            AssistantMessage("", (call,)),
            ToolResult.for_call(call, [image_part(640, 480)]),
        )
        new, _ = clear_images_history(history, 0, counter=COUNTER)
        assert new[1].content == "[image cleared: shot 640×480]"

    def test_tiny_images_are_not_replaced(self) -> None:
        """An image cheaper than its placeholder stays: the count never grows."""
        history = (UserMessage([image_part(8, 8)]), UserMessage([image_part(8, 8)]))
        new, stats = clear_images_history(history, 0, counter=COUNTER)
        assert new is history and not stats.changed

    @given(history=histories(media=0.6), keep=st.integers(0, 4))
    def test_invariants_on_generated_histories(self, history: Any, keep: int) -> None:
        """Pairing holds, nothing is removed, the count never grows, and it is idempotent."""
        new, stats = clear_images_history(history, keep, counter=COUNTER)
        check_pairing(new)
        assert len(new) == len(history)
        assert [type(m) for m in new] == [type(m) for m in history]
        assert COUNTER.count_messages(new) <= COUNTER.count_messages(history)
        assert len(_images(new)) >= min(keep, len(_images(history)))
        assert _images(new)[-keep:] == _images(history)[-keep:] if keep else True
        again, more = clear_images_history(new, keep, counter=COUNTER)
        assert again is new and not more.changed
        assert stats.freed_tokens >= 0


class TestMicrocompactKeepImages:
    """Microcompact(keep_images=N) clears images beside old tool results."""

    def test_pure_function_clears_both(self) -> None:
        """Old results lose their content; images past the newest N become text."""
        history = computer_use(6)
        new, stats = microcompact_history(history, keep_recent=4, keep_images=2, counter=COUNTER)
        assert stats.results_cleared == 2 and stats.images_cleared == 2
        assert len(_images(new)) == 2 and _images(new) == _images(history)[-2:]
        check_pairing(new)

    async def test_layer_keeps_newest_images_in_every_request(self) -> None:
        """Through the layer, the model sees only the newest images; persisted once."""
        layer = Microcompact(keep_recent=10, keep_images=3)
        history = computer_use(5)
        ctx = quiet_context(history)
        model = ScriptedModel([reply("ok")])
        await run_layer(layer, ModelRequest(history), ctx, model)
        sent = model.requests[0].messages
        assert len(_images(sent)) == 3
        assert ctx.conversation.messages == sent

    @given(history=histories(media=0.6), keep=st.integers(0, 3), images=st.integers(0, 3))
    def test_idempotent_and_paired(self, history: Any, keep: int, images: int) -> None:
        """Compacting twice changes nothing more; pairing holds."""
        new, _ = microcompact_history(history, keep, keep_images=images, counter=COUNTER)
        check_pairing(new)
        again, stats = microcompact_history(new, keep, keep_images=images, counter=COUNTER)
        assert again is new and not stats.changed


class TestGuardOrder:
    """Under pressure the guard clears old images before it touches old text."""

    async def test_images_go_first(self) -> None:
        """With room made by clearing images, no tool result text is cleared."""
        history = computer_use(12)
        before = COUNTER.count_messages(history)
        guard = BudgetGuard(max_tokens=before, counter=COUNTER, reserved_output_tokens=0)
        model = ScriptedModel([reply("ok")])
        with capture_events() as events:
            await run_layer(guard, ModelRequest(history), quiet_context(history), model)
        applied = [e for e in events if isinstance(e, ContextPolicyApplied)]
        assert [e.policy for e in applied] == ["ClearOldImages"]
        sent = model.requests[0].messages
        assert len(_images(sent)) == 3
        # every text is intact (a cleared image only adds its placeholder line)
        assert all(new.text.startswith(old.text) for new, old in zip(sent, history, strict=True))
        assert [e.source for e in events if isinstance(e, ImagesCleared)] == ["policy"]

    async def test_clear_old_images_layer(self) -> None:
        """The standalone layer keeps the newest N and reports what it cleared."""
        history = computer_use(4)
        model = ScriptedModel([reply("ok")])
        with capture_events() as events:
            await run_layer(ClearOldImages(2), ModelRequest(history), quiet_context(history), model)
        cleared = [e for e in events if isinstance(e, ImagesCleared)]
        assert cleared[0].images_cleared == 2 and cleared[0].persisted
        assert len(_images(model.requests[0].messages)) == 2


class TestSummariesSeeDescriptions:
    """Summarizers and transcripts get a text description of media, never base64."""

    async def test_extractive_summary_and_transcript(self) -> None:
        """The summary and the transcript name the screenshot and hold no base64."""
        history = computer_use(3)
        shot = _images(history)[0]
        assert shot.data is not None
        transcript = render_transcript(history)
        assert "[image: screenshot image/jpeg 1280×800]" in transcript
        assert shot.data[:40] not in transcript
        summary = await ExtractiveSummarizer().summarize(history, RunContext.new())
        assert shot.data[:40] not in summary
