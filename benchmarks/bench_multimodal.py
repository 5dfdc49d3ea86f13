"""Images in the context: a 500-message computer-use history with 100 screenshots.

Side by side in one run, each next to the same history with every screenshot left out
(the text-only history, the ``str`` fast path):

- a budget-guard check after one new message (target: <= 0.3 ms);
- a cold token count of the whole history;
- ``Microcompact(keep_images=3)`` per model call once persisted (the steady state);
- comparing and hashing a screenshot message against a text message (digests, not bytes).

Screenshots are the real 2560×1600 WebP captures of the captcha run in
``../shared/data/transcripts/multimodal`` when present, else 1280×800 PNGs built here.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, best_of, print_table

from tinyctx import (
    AssistantMessage,
    EventSink,
    ImagePart,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.middleware import BudgetGuard, Microcompact
from tinyctx.testing.images import image_part
from tinyctx.tokens import HeuristicCounter

MESSAGES = 500
SCREENSHOTS = 100
GUARD_TARGET = 0.3e-3


def _screenshots() -> list[ImagePart]:
    repo = Path(__file__).resolve().parents[1]
    for candidate in (
        os.environ.get("TINYCTX_SHARED_DATA", ""),
        str(repo.parent / "shared" / "data"),
        "/work/shared/data",
    ):
        folder = Path(candidate) / "transcripts" / "multimodal" / "openai" if candidate else None
        if folder is not None and folder.is_dir():
            from tinyctx.formats import load_transcript

            found = [
                p
                for path in sorted(folder.glob("*captcha*.jsonl"))
                for m in load_transcript(path)
                for p in m.parts
                if isinstance(p, ImagePart)
            ]
            if found:
                return found
    return [image_part(1280, 800, "image/png", label="screenshot")]


def histories() -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """(with screenshots, the same without them): 100 steps of click, result, screenshot,
    the rest plain conversation, 500 messages each."""
    shots = _screenshots()
    media: list[Message] = [UserMessage("Work through the booking form and submit it.")]
    text: list[Message] = list(media)
    step = 0
    while len(media) < MESSAGES:
        call = ToolCall(f"call_{step}", "computer", {"action": "click", "x": 10 * step, "y": 300})
        thought = AssistantMessage(f"Step {step}: clicking the next field.", (call,))
        caption = f"clicked at ({10 * step}, 300); the page changed"
        if step < SCREENSHOTS:
            shot = shots[step % len(shots)]
            result: Message = ToolResult.for_call(call, [TextPart(caption), shot])
        else:
            result = ToolResult.for_call(call, caption)
        plain = ToolResult.for_call(call, caption)
        note = AssistantMessage(f"The form shows field {step + 1} now.")
        for a, b in ((thought, thought), (result, plain), (note, note)):
            if len(media) < MESSAGES:
                media.append(a)
                text.append(b)
        step += 1
    return tuple(media), tuple(text)


async def _guard_seconds(history: tuple[Message, ...], repeat: int) -> float:
    """Seconds per guard check (below the trigger) after one new message."""
    response = ModelResponse(AssistantMessage("ok"))

    async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        return response

    grown = 50
    base = history[: len(history) - grown]
    requests = [ModelRequest(messages=history[: len(base) + k + 1]) for k in range(grown)]
    best = float("inf")
    for _ in range(repeat):
        guard = BudgetGuard(max_tokens=100_000_000, counter=HeuristicCounter())
        ctx = RunContext.new(events=EventSink(logger=None))
        await guard.wrap_model(ModelRequest(messages=base), ctx, core)
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for request in requests:
                await guard.wrap_model(request, ctx, core)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed / grown)
    return best


async def _microcompact_seconds(history: tuple[Message, ...], repeat: int) -> float:
    """Seconds per model call of ``Microcompact(keep_images=3)`` once the history is
    compacted and persisted: the conversation grows by one message per call."""
    response = ModelResponse(AssistantMessage("ok"))

    async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        return response

    best = float("inf")
    for _ in range(repeat):
        layer = Microcompact(keep_images=3, counter=HeuristicCounter())
        ctx = RunContext.new(events=EventSink(logger=None))
        conversation = ctx.conversation
        for message in history[:-50]:
            await conversation.append(message)
        await layer.wrap_model(ModelRequest(conversation.messages), ctx, core)
        tail = history[-50:]
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for message in tail:
                await conversation.append(message)
                await layer.wrap_model(ModelRequest(conversation.messages), ctx, core)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed / len(tail))
    return best


def _compare_rows(media: Sequence[Message], text: Sequence[Message], repeat: int) -> list[Row]:
    shot = next(m for m in media if isinstance(m, ToolResult) and m.parts[-1].kind == "image")
    twin = attrs_copy(shot)
    plain = next(m for m in text if isinstance(m, ToolResult))
    plain_twin = attrs_copy(plain)
    eq = best_of(lambda: shot == twin and hash(twin), number=20_000, repeat=repeat)
    eq_text = best_of(
        lambda: plain == plain_twin and hash(plain_twin), number=20_000, repeat=repeat
    )
    image = shot.parts[-1]
    assert isinstance(image, ImagePart)
    assert image.data is not None
    return [
        Row(
            "compare",
            "screenshot msg == and hash (copy)",
            eq,
            "text message",
            eq_text,
            extra={"base64_chars": len(image.data)},
        )
    ]


def attrs_copy(message: Message) -> Message:
    """An equal message that is a different object (same parts: what evolve gives)."""
    return message.evolve(metadata={"copy": True}).evolve(metadata={})


def run(quick: bool = False) -> list[Row]:
    media, text = histories()
    repeat = 3 if quick else 5
    rows: list[Row] = []
    guard = anyio.run(_guard_seconds, media, repeat, backend="trio")
    guard_text = anyio.run(_guard_seconds, text, repeat, backend="trio")
    rows.append(
        Row(
            "guard",
            f"{MESSAGES} msgs, {SCREENSHOTS} shots, +1 msg",
            guard,
            "text-only history",
            guard_text,
            target="<= 0.3 ms",
            met=guard <= GUARD_TARGET,
        )
    )
    number = 3 if quick else 10
    cold = best_of(lambda: HeuristicCounter().count_messages(media), number=number, repeat=repeat)
    cold_text = best_of(
        lambda: HeuristicCounter().count_messages(text), number=number, repeat=repeat
    )
    rows.append(
        Row("count", f"{MESSAGES} msgs cold, {SCREENSHOTS} shots", cold, "text-only", cold_text)
    )
    compact = anyio.run(_microcompact_seconds, media, repeat, backend="trio")
    compact_text = anyio.run(_microcompact_seconds, text, repeat, backend="trio")
    rows.append(
        Row("microcompact", "keep_images=3 per call, persisted", compact, "text-only", compact_text)
    )
    rows += _compare_rows(media, text, repeat)
    return rows


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))
