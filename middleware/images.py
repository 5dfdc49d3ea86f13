"""Clear old images: keep the newest ``keep_images`` images, name the others in text.

:func:`clear_images_history` is the pure function; :class:`ClearOldImages` wraps it on the
model onion (as Anthropic's computer-use reference keeps only the newest screenshots) and
serves a :class:`~tinyctx.middleware.budget.BudgetGuard` as its ``"images"`` policy, which
the default order runs before compacting text: an old screenshot costs about as much as
1,500 tokens of text and says less about the task than the text around it.
:class:`~tinyctx.middleware.microcompact.Microcompact` takes ``keep_images=N`` too.

Images are counted from the newest message back, in user messages and tool results alike
(within a message, its last image is the newest). Each image past the newest
``keep_images`` becomes a text part ``[image cleared: screenshot 1280×800]`` naming its
label (or the tool that returned it) and size; every other part, every message and the
call/result pairing stay. A message is changed only when that lowers its token estimate
(a tiny image can cost less than its placeholder), so the count never grows. Idempotent:
a cleared image is text, and text is never cleared here.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any, ClassVar

import attrs
from attrs import frozen

from tinyctx import (
    Event,
    ImagePart,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    TextPart,
    ToolResult,
    UserMessage,
)
from tinyctx.events import EventLevel
from tinyctx.parts import Content, Part, content_text
from tinyctx.tokens import TokenCounter, default_counter

from ._compaction import (
    as_history,
    check_bool,
    check_counter,
    check_int,
    commit,
    mark,
    remap_replaced,
)
from .policy import Relief
from .triggers import Trigger, acts_on
from .triggers import trigger as as_trigger

__all__ = [
    "ClearOldImages",
    "ImageClearStats",
    "ImagesCleared",
    "clear_images_history",
    "image_placeholder",
]


@frozen
class ImageClearStats:
    """What one pass cleared: images, the messages they were in, bytes and tokens freed."""

    images_cleared: int = 0
    messages_changed: int = 0
    bytes_freed: int = 0
    freed_tokens: int = 0

    @property
    def changed(self) -> bool:
        return self.images_cleared > 0


_NOTHING = ImageClearStats()


def image_placeholder(part: ImagePart, source: str = "") -> str:
    """``[image cleared: <label or source> <w>×<h>]``: what stands where ``part`` was."""
    words = [part.label or source or "image"]
    if part.width is not None:
        words.append(f"{part.width}×{part.height}")
    elif part.url is not None:
        words.append(f"from {part.url[:80]}")
    return f"[image cleared: {' '.join(words)}]"


def _image_count(content: tuple[Part, ...]) -> int:
    return sum(1 for part in content if type(part) is ImagePart)


def _without_images(
    message: UserMessage | ToolResult, content: tuple[Part, ...], keep: int
) -> Message:
    """``message`` with all but its last ``keep`` images replaced by placeholders."""
    source = message.name if isinstance(message, ToolResult) else ""
    parts: list[Part] = []
    cleared = 0
    remaining = _image_count(content)
    for part in content:
        if type(part) is ImagePart:
            remaining -= 1
            if remaining >= keep:  # not one of this message's newest ``keep`` images
                parts.append(TextPart(image_placeholder(part, source)))
                cleared += 1
                continue
        parts.append(part)
    meta = mark(message.metadata, "images_cleared", {"by": "images", "count": cleared})
    content_out: Content = tuple(parts)
    if all(type(p) is TextPart for p in parts):  # no media left: plain text, as formats read it
        content_out = content_text(content_out)
    return attrs.evolve(message, content=content_out, metadata=meta)


def clear_images_history(
    history: Sequence[Message],
    keep_images: int = 3,
    *,
    counter: TokenCounter | None = None,
    memo: MutableMapping[int, tuple[Message, Message, int]] | None = None,
) -> tuple[tuple[Message, ...], ImageClearStats]:
    """Replace every image but the newest ``keep_images`` with a text placeholder.

    Returns the input tuple itself when nothing changed. ``memo`` (a dict the caller keeps
    between calls with the same ``keep_images``) reuses a message cleared before, so a
    transient layer re-clearing the same history costs lookups, not new messages.
    """
    history = as_history(history)
    check_int(keep_images, "keep_images", "clear_images_history")
    count = (counter or default_counter()).count_message
    seen = 0
    out: list[Message] | None = None
    cleared = changed = freed_bytes = freed_tokens = 0
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if not isinstance(message, (UserMessage, ToolResult)):
            continue
        content = message.content
        if isinstance(content, str):
            continue
        images = _image_count(content)
        if not images:
            continue
        keep = max(0, keep_images - seen)
        seen += images
        if keep >= images:
            continue
        known = memo.get(id(message)) if memo is not None else None
        if known is not None and known[0] is message and known[2] == keep:
            new = known[1]
        else:
            new = _without_images(message, content, keep)
            if memo is not None:
                memo[id(message)] = (message, new, keep)
        saved = count(message) - count(new)
        if saved <= 0:
            continue
        if out is None:
            out = list(history)
        out[index] = new
        cleared += images - keep
        changed += 1
        freed_tokens += saved
        freed_bytes += sum(p.nbytes for p in content if type(p) is ImagePart and p not in new.parts)
    if out is None:
        return history, _NOTHING
    return tuple(out), ImageClearStats(cleared, changed, freed_bytes, freed_tokens)


@frozen
class ImagesCleared(Event):
    """Old images were replaced by placeholders (``persisted``: committed to history)."""

    kind: ClassVar[str] = "compaction.images"
    level: ClassVar[EventLevel] = "info"
    images_cleared: int = 0
    messages_changed: int = 0
    bytes_freed: int = 0
    freed_tokens: int = 0
    persisted: bool = False
    source: str = "layer"

    @classmethod
    def of(
        cls, stats: ImageClearStats, *, persisted: bool = False, source: str = "layer"
    ) -> ImagesCleared:
        return cls(
            images_cleared=stats.images_cleared,
            messages_changed=stats.messages_changed,
            bytes_freed=stats.bytes_freed,
            freed_tokens=stats.freed_tokens,
            persisted=persisted,
            source=source,
        )

    def describe(self) -> str | None:
        if self.source != "layer":
            return None  # as a guard policy, the guard's own event reports it
        return f"images -{self.freed_tokens} ({self.images_cleared} cleared)"


class ClearOldImages(Layer):
    """Keeps only the newest ``keep_images`` images (default 3) in the model requests.

    Clearing an image rewrites an old message, which breaks a provider's cached prompt
    prefix, so the layer acts only when it is needed: ``trigger`` (tokens, a fraction of the
    usable window, a message count, or AND/OR combinations:
    :mod:`tinyctx.middleware.triggers`) says when; the default fires only when the request
    would not fit the run's usable window (``RunConfig.usable_tokens``), so on a conversation
    that fits it never costs more than no management (with no window known it clears on
    every call). ``trigger=1`` clears on every call.

    ``persist=True`` (the default) commits the placeholders to the conversation, so the
    prompt-cache prefix stays stable and later calls have nothing to redo; ``persist=False``
    rewrites only this call's request. As a budget guard policy (role ``"images"``) it
    clears past the same ``keep_images`` and leaves committing to the guard.
    """

    role = "images"  # its place in a BudgetGuard's policy order
    breaker_group: str | None = None
    idempotent = True  # a cleared image is text: its own output passes unchanged

    def __init__(
        self,
        keep_images: int = 3,
        *,
        persist: bool = True,
        counter: TokenCounter | None = None,
        trigger: Any = None,
        name: str | None = None,
    ) -> None:
        owner = type(self).__name__
        self.keep_images = check_int(keep_images, "keep_images", owner)
        self.trigger: Trigger | None = None if trigger is None else as_trigger(trigger, owner=owner)
        self.persist = check_bool(persist, "persist", owner)
        self.counter = check_counter(counter, owner)
        if name is not None:
            self.name = name

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        messages = request.messages
        if self.trigger is not None or ctx.config.usable_tokens is not None:
            counter = self.counter or default_counter()
            tokens = counter.count_request(request)
            usable = ctx.config.usable_tokens
            if not acts_on(self.trigger, tokens, len(messages), usable, type(self).__name__):
                return await call_next(request, ctx)
        memo: dict[int, tuple[Message, Message, int]] = ctx.state_for(self, dict)
        new, stats = clear_images_history(
            messages, self.keep_images, counter=self.counter, memo=memo
        )
        if new is messages:
            return await call_next(request, ctx)
        persisted = False
        if self.persist:
            persisted, new = commit(ctx, messages, new, remap_replaced(messages, new))
        if len(memo) > 2 * len(new) + 64:
            live = {id(m) for m in messages}
            for key in [k for k in memo if k not in live]:
                del memo[key]
        ctx.emit(ImagesCleared.of(stats, persisted=persisted))
        return await call_next(request.evolve(messages=new), ctx)

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        """Clear every image past the newest ``keep_images`` (all of them at once: one
        larger change is kinder to a prompt cache than many small ones)."""
        new, stats = clear_images_history(messages, self.keep_images, counter=counter)
        if stats.changed:
            ctx.emit(ImagesCleared.of(stats, source="policy"))
        return Relief(new, stats.freed_tokens, attrs.asdict(stats))
