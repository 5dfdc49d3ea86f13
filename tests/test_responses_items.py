"""The Responses API items encoding: messages to input items and back, real transcripts
replayed through it, and reasoning items that never lose their turn to a compaction."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    DocumentPart,
    ImagePart,
    Message,
    ModelRequest,
    ToolResult,
    before_model,
)
from tinyctx.formats import load_transcript
from tinyctx.formats._common import core
from tinyctx.messages import check_pairing, safe_boundaries
from tinyctx.middleware.stacks import default_stack
from tinyctx.parts import Part
from tinyctx.providers._responses_items import (
    ITEMS,
    RESPONSES,
    assistant_from_output,
    from_responses_input,
    reasoning_items,
    to_responses_input,
)
from tinyctx.replay import replay
from tinyctx.testing.strategies import histories

TRANSCRIPTS = (
    "OpenHands__software-agent-sdk__fncall-llm-message",
    "marot__spotter__cc-subagent-a2898e3",
)


def _api_part(part: Part) -> Part:
    if isinstance(part, ImagePart):
        changes: dict[str, Any] = {
            "label": "",
            "detail": None if part.detail == "auto" else part.detail,
        }
        if part.data is None:
            changes.update(width=None, height=None, media_type=None)
        return attrs.evolve(part, **changes)
    if isinstance(part, DocumentPart) and part.data is None:
        return attrs.evolve(part, media_type=None, pages=None)
    return part


def api_view(message: Message) -> Message:
    """What the Responses API carries of a message: no metadata, no essential flag, no
    tool error flag (the model reads an error from the result's text), and of an image
    or file only what the API's parts say (no local label; no size for a URL image)."""
    plain = core(message)
    if isinstance(plain, ToolResult) and plain.is_error:
        plain = plain.evolve(is_error=False)
    content = getattr(plain, "content", "")
    if isinstance(content, tuple):
        plain = plain.evolve(content=tuple(_api_part(p) for p in content))
    return plain


def merged(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as the wire says them: an answer right before a turn of calls alone
    is one model turn on the wire (``[message, function_call]``), so it reads back as one
    assistant message."""
    out: list[Message] = []
    for message in messages:
        previous = out[-1] if out else None
        if (
            isinstance(message, AssistantMessage)
            and isinstance(previous, AssistantMessage)
            and not previous.tool_calls
            and previous.content
            and message.tool_calls
            and not message.content
        ):
            out[-1] = previous.evolve(tool_calls=message.tool_calls)
        else:
            out.append(message)
    return out


def with_reasoning(messages: Sequence[Message]) -> list[Message]:
    """Each assistant message as a reasoning model's response would make it: a reasoning
    item (with encrypted content) before its message and calls."""
    out: list[Message] = []
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and (message.content or message.tool_calls):
            thought = {
                "id": f"rs_{index}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"thinking {index}"}],
                "encrypted_content": f"enc-{index}",
            }
            generated = to_responses_input([message])
            turn = assistant_from_output([thought, *generated], index=index)
            message = message.evolve(metadata={**message.metadata, **turn.metadata})
        out.append(message)
    return out


def check_reasoning_travels(messages: Sequence[Message], items: list[dict[str, Any]]) -> None:
    """Every reasoning item sent is one of a sent assistant message's, and an item of its
    own turn follows it; every kept message's reasoning is sent."""
    expected = [r["id"] for m in messages for r in reasoning_items(m)]
    sent = [item["id"] for item in items if item.get("type") == "reasoning"]
    assert sent == expected
    for position, item in enumerate(items):
        if item.get("type") == "reasoning":
            following = items[position + 1] if position + 1 < len(items) else None
            assert following is not None, "a reasoning item ends the input"
            assert following.get("type") in ("reasoning", "function_call", "message")
            assert following.get("role", "assistant") == "assistant"


class TestRoundTrip:
    """Messages -> input items -> messages gives back what the API carries."""

    @settings(deadline=None)
    @given(histories(max_turns=8))
    def test_every_history_reads_back(self, history: tuple[Message, ...]) -> None:
        """from_responses_input(to_responses_input(h)) is h as the API carries it."""
        back = from_responses_input(to_responses_input(history))
        assert list(back) == merged([api_view(m) for m in history])
        check_pairing(back)

    @settings(deadline=None)
    @given(histories(max_turns=8, media=0))
    def test_reasoning_kept_with_its_turn_reads_back_whole(
        self, history: tuple[Message, ...]
    ) -> None:
        """A turn's kept items (reasoning included) are written and read back unchanged."""
        kept = with_reasoning([api_view(m) for m in history])
        assert list(from_responses_input(to_responses_input(kept))) == kept

    def test_an_edited_turn_keeps_its_reasoning_before_the_new_items(self) -> None:
        """A layer that rewrites a turn's text: the new text goes, after its reasoning."""
        (turn,) = with_reasoning([AssistantMessage("original answer")])
        items = to_responses_input([turn.evolve(content="[shortened]")])
        assert [i["type"] for i in items] == ["reasoning", "message"]
        assert items[1]["content"] == "[shortened]"

    def test_a_turn_left_empty_still_follows_its_reasoning(self) -> None:
        """An assistant message emptied by a layer is an empty message after its reasoning,
        never a lone reasoning item."""
        (turn,) = with_reasoning([AssistantMessage("answer")])
        items = to_responses_input([turn.evolve(content="")])
        assert [i["type"] for i in items] == ["reasoning", "message"]
        assert items[1]["content"] == ""

    def test_a_result_without_its_call_is_an_error_naming_it(self) -> None:
        """A function_call_output with no earlier call is a FormatError at its index."""
        from tinyctx.formats import FormatError

        items = [{"type": "function_call_output", "call_id": "nope", "output": "x"}]
        with pytest.raises(FormatError, match="nope") as caught:
            from_responses_input(items)
        assert caught.value.index == 0

    def test_kept_items_name_their_namespace(self) -> None:
        """The items live under metadata["openai_responses"]["items"]."""
        (turn,) = with_reasoning([AssistantMessage("a")])
        assert turn.metadata[RESPONSES][ITEMS][0]["type"] == "reasoning"


class TestRealTranscripts:
    """Two real agent transcripts go through the encoding and back intact."""

    @pytest.mark.parametrize("stem", TRANSCRIPTS)
    def test_a_real_transcript_reads_back_with_pairing_intact(
        self, shared_data: Path, stem: str
    ) -> None:
        """Every message comes back as the API carries it; every call keeps its result."""
        history = load_transcript(shared_data / "transcripts" / "openai" / f"{stem}.jsonl")
        items = to_responses_input(history)
        calls = [i["call_id"] for i in items if i["type"] == "function_call"]
        outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
        assert set(outputs) <= set(calls) and len(calls) == len(set(calls))
        back = from_responses_input(items)
        assert list(back) == [api_view(m) for m in history]
        check_pairing(back)
        with_thoughts = with_reasoning(back)
        assert list(from_responses_input(to_responses_input(with_thoughts))) == with_thoughts


class TestCompactionKeepsReasoningWithItsTurn:
    """Whatever a compaction keeps or drops, reasoning goes with the turn it came with."""

    @settings(deadline=None)
    @given(histories(min_turns=1, max_turns=10, media=0), st.data())
    def test_any_safe_cut_and_cleared_results_keep_reasoning_paired(
        self, history: tuple[Message, ...], data: st.DataObject
    ) -> None:
        """Dropping a prefix at a safe boundary and clearing old results (what trimming
        and microcompaction do) never orphans a reasoning item."""
        kept = with_reasoning(history)
        cuts = [i for i, safe in enumerate(safe_boundaries(kept)) if safe]
        cut = data.draw(st.sampled_from(cuts))
        rest = [
            m.evolve(content="[Old tool result content cleared]")
            if isinstance(m, ToolResult) and data.draw(st.booleans())
            else m
            for m in kept[cut:]
        ]
        check_reasoning_travels(rest, to_responses_input(rest))

    async def test_the_default_stack_never_orphans_reasoning(
        self, shared_data: Path, anyio_backend: str
    ) -> None:
        """A real transcript with reasoning on every turn, replayed through the default
        stack in a small window: every request it sends keeps reasoning with its turn."""
        stem = "marot__spotter__cc-subagent-a2898e3"
        history = with_reasoning(
            load_transcript(shared_data / "transcripts" / "openai" / f"{stem}.jsonl")
        )
        sent: list[tuple[Message, ...]] = []

        @before_model
        async def capture(request: ModelRequest, ctx: Any) -> None:
            sent.append(request.messages)

        report = await replay(history, [*default_stack(), capture], window=24_000)
        assert len(sent) == len(report.rows) > 10
        assert any(len(messages) < len(history) // 2 for messages in sent)  # it compacted
        for messages in sent:
            check_pairing(messages)
            check_reasoning_travels(messages, to_responses_input(messages))
