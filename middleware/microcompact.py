"""Microcompaction: clear the content of old tool results, keep every message and pairing.

:func:`microcompact` is the pure function (history in, new history and stats out);
:class:`Microcompact` wraps it on the model onion and serves the budget guard as a
pressure policy.

Every tool result except those answering the newest ``keep_recent`` assistant tool-call
turns gets its content replaced by a placeholder. No message and no result is removed, so
every ``tool_call_id`` and the call/result pairing survive. It is idempotent: results that
already hold the placeholder are skipped and not counted, and results no longer than the
placeholder are left alone (clearing them would free nothing), so the token estimate never
grows. Results of ``exclude_tools`` are never cleared.

Cost: one pass from the newest message back to the oldest protected turn, then one pass
over the older part doing an ``isinstance`` and a string comparison per message. When
nothing changes the input tuple itself is returned: no allocation, no token counting.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any, ClassVar

import attrs
from attrs import frozen

from tinyctx import (
    AssistantMessage,
    Event,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolResult,
)
from tinyctx.config import text
from tinyctx.events import EventLevel
from tinyctx.parts import content_bytes
from tinyctx.tokens import TokenCounter, default_counter

from ._cleared_inputs import CLEARED_ARGUMENTS, clear_turn_inputs
from ._compaction import (
    as_history,
    check_bool,
    check_counter,
    check_int,
    check_tool_names,
    commit,
    mark,
    protected_from,
    remap_replaced,
    utf8_len,
)
from .images import clear_images_history
from .policy import Relief
from .triggers import Trigger, acts_on, fits_after
from .triggers import trigger as as_trigger

__all__ = [
    "CLEARED_ARGUMENTS",
    "SHORT_RESULT_TOKENS",
    "DEFAULT_PLACEHOLDER",
    "MicrocompactStats",
    "microcompact_history",
    "Microcompact",
    "MicrocompactApplied",
]

DEFAULT_PLACEHOLDER = "[Old tool result content cleared]"


@frozen
class MicrocompactStats:
    """What one microcompaction cleared (already-cleared results are not counted)."""

    turns_cleared: int = 0
    results_cleared: int = 0
    bytes_freed: int = 0
    freed_tokens: int = 0
    images_cleared: int = 0
    """Images replaced by placeholders (``keep_images``), in any message."""
    inputs_cleared: int = 0
    """Tool calls whose arguments were cleared (``clear_tool_inputs``)."""

    @property
    def changed(self) -> bool:
        return self.results_cleared > 0 or self.inputs_cleared > 0 or self.images_cleared > 0


_NOTHING = MicrocompactStats()


def _check_placeholder(value: Any, owner: str) -> str:
    return text().check(value, "placeholder", owner)


def _tool_name(call_message: Message | None, result: ToolResult) -> str:
    """The result's tool name, from its call when the result does not carry one."""
    if result.name or not isinstance(call_message, AssistantMessage):
        return result.name
    for call in call_message.tool_calls:
        if call.id == result.tool_call_id:
            return call.name
    return ""


def _candidates(
    prefix: tuple[Message, ...],
    placeholder: str,
    excluded: frozenset[str],
    counter: TokenCounter | None,
) -> list[ToolResult]:
    """The results of ``prefix`` that clearing could shrink; [] in the steady state.

    The hot loop: one type test per message and, per tool result, a length test that
    already-cleared and short results fail at once.
    """
    size = len(placeholder)
    band = 4 * size
    placeholder_tokens = -1
    found: list[ToolResult] = []
    # with no subclass of ToolResult anywhere, an exact type test is the same and cheaper
    if ToolResult.__subclasses__():
        results = [m for m in prefix if isinstance(m, ToolResult)]
    else:
        results = [m for m in prefix if type(m) is ToolResult]
    for message in results:
        content = message.content
        if type(content) is not str:  # parts: an image or document always outweighs it
            if not (excluded and message.name in excluded):
                found.append(message)
            continue
        if len(content) <= size:
            continue  # already cleared (it is the placeholder's size) or too short to matter
        if excluded and message.name in excluded:
            continue
        if len(content) <= band:
            # a little longer than the placeholder: clear it only if that saves tokens
            count_text = (counter or default_counter()).count_text
            if placeholder_tokens < 0:
                placeholder_tokens = count_text(placeholder)
            if count_text(content) <= placeholder_tokens:
                continue
        found.append(message)
    return found


def _cleared(message: ToolResult, placeholder: str, original_bytes: int) -> ToolResult:
    meta = mark(
        message.metadata, "cleared", {"by": "microcompact", "original_bytes": original_bytes}
    )
    if type(message) is ToolResult:
        return ToolResult(
            message.tool_call_id,
            placeholder,
            message.name,
            message.is_error,
            essential=message.essential,
            metadata=meta,
        )
    return attrs.evolve(message, content=placeholder, metadata=meta)


def microcompact_history(
    history: Sequence[Message],
    keep_recent: int = 5,
    placeholder: str = DEFAULT_PLACEHOLDER,
    exclude_tools: Iterable[str] = (),
    *,
    counter: TokenCounter | None = None,
    memo: MutableMapping[int, tuple[ToolResult, ToolResult, int]] | None = None,
    keep_images: int | None = None,
    image_memo: MutableMapping[int, tuple[Message, Message, int]] | None = None,
    clear_inputs: bool = False,
    need: int | None = None,
) -> tuple[tuple[Message, ...], MicrocompactStats]:
    """Clear the content of every tool result older than the newest ``keep_recent`` turns.

    With ``clear_inputs`` the arguments of the calls whose results it clears are cleared too:
    each such call keeps its id and name (so pairing holds) and gets ``{}`` as arguments
    (:data:`CLEARED_ARGUMENTS`, what LangChain's ``clear_tool_inputs`` sends); the assistant
    message is marked ``metadata["tinyctx"]["cleared_inputs"]`` with the call ids.

    With ``need`` it clears oldest first and stops once the cleared results free at least
    ``need`` tokens (what a budget guard asks for to reach its low-water mark), so the newer
    results stay as they are; results that free at most :data:`SHORT_RESULT_TOKENS` (cheap
    to keep, dense in the paths and names an agent reuses) go only after all the others.

    A turn is an assistant message with tool calls; its results keep their content while it
    is one of the newest ``keep_recent``. A cleared result gets ``placeholder`` as content
    and ``metadata["tinyctx"]["cleared"]``; nothing is removed. A result is only cleared
    when that lowers its token estimate under ``counter`` (default: the shared heuristic
    counter), which also measures ``freed_tokens``. Returns the input tuple itself when
    nothing changed.

    ``memo`` is a dict the caller keeps between calls with the same settings: a result
    cleared before is reused from it, so compacting an uncompacted history again and again
    (a transient layer) costs lookups, not new messages.

    ``keep_images=N`` then also replaces every image but the newest ``N`` — in tool
    results and user messages — with a text placeholder naming it (see
    :func:`~tinyctx.middleware.images.clear_images_history`; ``image_memo`` is its memo).
    """
    out, stats = _clear_results(
        history, keep_recent, placeholder, exclude_tools, counter, memo, clear_inputs, need
    )
    return _clear_images(out, stats, keep_images, counter, image_memo)


def _clear_images(
    history: tuple[Message, ...],
    stats: MicrocompactStats,
    keep_images: int | None,
    counter: TokenCounter | None,
    memo: MutableMapping[int, tuple[Message, Message, int]] | None,
) -> tuple[tuple[Message, ...], MicrocompactStats]:
    """``history`` with images past the newest ``keep_images`` cleared, stats merged."""
    if keep_images is None:
        return history, stats
    out, images = clear_images_history(history, keep_images, counter=counter, memo=memo)
    if not images.changed:
        return history, stats
    merged = attrs.evolve(
        stats,
        images_cleared=images.images_cleared,
        bytes_freed=stats.bytes_freed + images.bytes_freed,
        freed_tokens=stats.freed_tokens + images.freed_tokens,
    )
    return out, merged


def _clear_results(
    history: Sequence[Message],
    keep_recent: int,
    placeholder: str,
    exclude_tools: Iterable[str],
    counter: TokenCounter | None,
    memo: MutableMapping[int, tuple[ToolResult, ToolResult, int]] | None,
    clear_inputs: bool = False,
    need: int | None = None,
) -> tuple[tuple[Message, ...], MicrocompactStats]:
    history = as_history(history)
    check_int(keep_recent, "keep_recent", "microcompact")
    _check_placeholder(placeholder, "microcompact")
    excluded = (
        exclude_tools
        if type(exclude_tools) is frozenset
        else check_tool_names(exclude_tools, "exclude_tools", "microcompact")
    )
    cutoff = protected_from(history, keep_recent)
    if not cutoff:
        return history, _NOTHING
    prefix = history if cutoff == len(history) else history[:cutoff]
    candidates = _candidates(prefix, placeholder, excluded, counter)
    if not candidates:
        return history, _NOTHING
    counting = counter or default_counter()
    count = counting.count_message
    placeholder_bytes = utf8_len(placeholder)
    clears: list[tuple[int, int, ToolResult, int, int]] = []  # index, owner, new, saved, bytes
    owner = -1  # index of the assistant message the results being walked answer
    targets = iter(candidates)
    target: ToolResult | None = next(targets)
    for index, message in enumerate(prefix):
        if target is None:
            break
        if isinstance(message, AssistantMessage):
            owner = index
            continue
        if message is not target:
            continue
        result, target = target, next(targets, None)
        if excluded and _tool_name(history[owner] if owner >= 0 else None, result) in excluded:
            continue
        new, original_bytes = _remembered_clear(result, placeholder, memo)
        saved = count(result) - count(new)
        if saved > 0:
            clears.append((index, owner, new, saved, original_bytes - placeholder_bytes))
    if need is not None:
        clears = _relief_order(clears, need)
    out = list(history)
    turns: set[int] = set()
    cleared = freed_bytes = freed_tokens = 0
    for index, owner, new, saved, freed in clears:
        out[index] = new
        cleared += 1
        turns.add(owner)
        freed_bytes += freed
        freed_tokens += saved
    inputs = 0
    if clear_inputs and cleared:
        inputs, inputs_tokens = clear_turn_inputs(history, out, turns, counting)
        freed_tokens += inputs_tokens
    if not cleared:
        return history, _NOTHING
    return tuple(out), MicrocompactStats(
        len(turns), cleared, freed_bytes, freed_tokens, inputs_cleared=inputs
    )


SHORT_RESULT_TOKENS = 100
"""A relief (``need``) clears the results that free at most this many tokens last: they are
cheap to keep and dense in what an agent reuses (a path, a test name). On the shared
transcripts (``benchmarks/bench_forgetting.py``) 64 to 128 tokens lost the same uses, fewer
than clearing strictly oldest first at 24K and as many at every other window; 256 lost more
at 32K, and clearing the largest first lost 12% more uses at 32K."""


def _relief_order(
    clears: list[tuple[int, int, ToolResult, int, int]], need: int
) -> list[tuple[int, int, ToolResult, int, int]]:
    """The ``clears`` a relief makes to free ``need`` tokens: oldest first, the short ones
    (:data:`SHORT_RESULT_TOKENS`) after all the others; back in history order."""
    order = [c for c in clears if c[3] > SHORT_RESULT_TOKENS]
    order += [c for c in clears if c[3] <= SHORT_RESULT_TOKENS]
    chosen: list[tuple[int, int, ToolResult, int, int]] = []
    freed = 0
    for clear in order:
        if freed >= need:
            break
        chosen.append(clear)
        freed += clear[3]
    return sorted(chosen, key=lambda c: c[0])


def _remembered_clear(
    result: ToolResult,
    placeholder: str,
    memo: MutableMapping[int, tuple[ToolResult, ToolResult, int]] | None,
) -> tuple[ToolResult, int]:
    """``result`` cleared and its original size in bytes, reused from ``memo`` if there."""
    known = memo.get(id(result)) if memo is not None else None
    if known is not None and known[0] is result:
        _, new, original_bytes = known
        return new, original_bytes
    original_bytes = content_bytes(result.content)
    new = _cleared(result, placeholder, original_bytes)
    if memo is not None:
        memo[id(result)] = (result, new, original_bytes)
    return new, original_bytes


@frozen
class MicrocompactApplied(Event):
    """Old tool results were cleared (``persisted``: committed to the conversation)."""

    kind: ClassVar[str] = "compaction.microcompact"
    level: ClassVar[EventLevel] = "info"
    turns_cleared: int = 0
    results_cleared: int = 0
    bytes_freed: int = 0
    freed_tokens: int = 0
    inputs_cleared: int = 0
    persisted: bool = False
    source: str = "layer"
    images_cleared: int = 0

    @classmethod
    def of(
        cls, stats: MicrocompactStats, *, persisted: bool = False, source: str = "layer"
    ) -> MicrocompactApplied:
        return cls(
            turns_cleared=stats.turns_cleared,
            results_cleared=stats.results_cleared,
            bytes_freed=stats.bytes_freed,
            freed_tokens=stats.freed_tokens,
            inputs_cleared=stats.inputs_cleared,
            persisted=persisted,
            source=source,
            images_cleared=stats.images_cleared,
        )

    def describe(self) -> str | None:
        if self.source != "layer":
            return None  # as a guard policy, the guard's own event reports it
        return f"microcompact -{self.freed_tokens} ({self.results_cleared} results)"


class _Session:
    """What a layer remembers within one session, so that its steady state costs little.

    ``out`` is the history it passed on last time and ``start`` an assistant-message index
    below which ``out`` needs no more work: every older result is cleared, or was kept for a
    reason that still holds. ``cleared`` maps originals to their cleared copies (see
    ``microcompact_history(memo=...)``), so a transient layer re-clears the same results for free.
    """

    __slots__ = ("cleared", "images", "out", "start")

    def __init__(self) -> None:
        self.cleared: dict[int, tuple[ToolResult, ToolResult, int]] = {}
        self.images: dict[int, tuple[Message, Message, int]] = {}
        self.out: tuple[Message, ...] = ()
        self.start = 0

    def done_before(self, messages: tuple[Message, ...]) -> int:
        """How many leading messages of ``messages`` need no work (0: unknown).

        Persisted, each history starts with what was passed on last time: one C-level
        comparison of that prefix (identity first) tells.
        """
        start = self.start
        if not start or len(messages) <= start:
            return 0
        if messages is self.out or messages[:start] == self.out[:start]:
            return start
        return 0

    def remember(self, passed: tuple[Message, ...], keep: int) -> None:
        start = min(protected_from(passed, keep) or 0, len(passed) - 1)
        while start > 0 and not isinstance(passed[start], AssistantMessage):
            start -= 1
        self.out, self.start = passed, max(start, 0)
        if len(self.cleared) > 2 * len(passed) + 64:  # forget results that left the history
            live = {id(m) for m in passed}
            self.cleared = {k: v for k, v in self.cleared.items() if k in live}
        if len(self.images) > 2 * len(passed) + 64:
            live = {id(m) for m in passed}
            self.images = {k: v for k, v in self.images.items() if k in live}


class Microcompact(Layer):
    """Clears old tool results before each model call (see :func:`microcompact_history`).

    Clearing rewrites old messages, which breaks a provider's cached prompt prefix: the
    next call pays a cache write of everything after the first cleared result. So the layer
    acts only when it is worth it:

    - ``trigger`` (tokens, a fraction of the usable window, a message count, or AND/OR
      combinations: :mod:`tinyctx.middleware.triggers`) says when. The default fires only
      when the request would not fit the run's usable window (``RunConfig.usable_tokens``),
      so on a conversation that fits it never costs more than no management; with no window
      known it clears on every call.
    - ``clear_at_least`` (tokens, default 0) leaves the history alone when clearing would free
      less: a small saving is not worth a broken prefix.
    - With the window known, a clear that would leave the request over it is held back: the
      call overflows either way, and the clear of a later call, once the turns that do not
      fit have aged out of ``keep_recent``, covers these results in the same one break.
    - ``clear_tool_inputs`` also clears the arguments of the calls whose results it clears
      (they become ``{}``; ids, names and pairing are kept).

    ``persist=True`` (the default) commits the cleared results to the conversation, so the
    next call starts from the compacted history and the cached prefix stays stable;
    ``persist=False`` rewrites only the request of this call. As a pressure policy
    (``relieve``) it clears oldest first, short results last, until the guard's ``need`` is met,
    ignoring the trigger and ``clear_at_least``, and leaves committing to the guard.

    ``keep_images=N`` (default None: off) also keeps only the newest ``N`` images of the
    history — in tool results and user messages, whatever their turn — and replaces each
    older one with a placeholder such as ``[image cleared: screenshot 1280×800]``.
    """

    idempotent = True  # cleared results are skipped: its own output passes unchanged

    role = "compact"  # its place in a BudgetGuard's policy order
    breaker_group: str | None = None

    def __init__(
        self,
        keep_recent: int = 5,
        placeholder: str = DEFAULT_PLACEHOLDER,
        exclude_tools: Iterable[str] = (),
        persist: bool = True,
        counter: TokenCounter | None = None,
        *,
        trigger: Any = None,
        clear_at_least: int = 0,
        clear_tool_inputs: bool = False,
        keep_images: int | None = None,
        name: str | None = None,
    ) -> None:
        owner = type(self).__name__
        self.keep_recent = check_int(keep_recent, "keep_recent", owner)
        self.keep_images = (
            None if keep_images is None else check_int(keep_images, "keep_images", owner)
        )
        self.placeholder = _check_placeholder(placeholder, owner)
        self.exclude_tools = check_tool_names(exclude_tools, "exclude_tools", owner)
        self.trigger: Trigger | None = None
        if trigger is not None:
            self.trigger = as_trigger(trigger, owner=owner)
        self.clear_at_least = check_int(clear_at_least, "clear_at_least", owner)
        self.clear_tool_inputs = check_bool(clear_tool_inputs, "clear_tool_inputs", owner)
        self.persist = check_bool(persist, "persist", owner)
        self.counter = check_counter(counter, owner)
        if name is not None:
            self.name = name

    def fires(self, request: ModelRequest, ctx: RunContext[Any], counter: TokenCounter) -> bool:
        """Whether the trigger says to clear before this request (see the class doc)."""
        return acts_on(
            self.trigger,
            counter.count_request(request),
            len(request.messages),
            ctx.config.usable_tokens,
            type(self).__name__,
        )

    def _run(
        self,
        messages: tuple[Message, ...],
        counter: TokenCounter,
        memo: MutableMapping[int, tuple[ToolResult, ToolResult, int]] | None = None,
        need: int | None = None,
        image_memo: MutableMapping[int, tuple[Message, Message, int]] | None = None,
    ) -> tuple[tuple[Message, ...], MicrocompactStats]:
        return microcompact_history(
            messages,
            self.keep_recent,
            self.placeholder,
            self.exclude_tools,
            counter=counter,
            memo=memo,
            keep_images=self.keep_images,
            image_memo=image_memo,
            clear_inputs=self.clear_tool_inputs,
            need=need,
        )

    def _compact(
        self, messages: tuple[Message, ...], counter: TokenCounter, session: _Session
    ) -> tuple[tuple[Message, ...], MicrocompactStats]:
        """:func:`microcompact` of ``messages``, working only past what the session knows.

        When the history starts with the compacted prefix this layer passed on last time,
        only the window from there on is compacted; the window starts at an assistant
        message and must hold every protected turn, or the whole history is done. The
        result and the stats equal those of compacting the whole history.
        """
        start = session.done_before(messages)
        if start:
            window = messages[start:]
            if protected_from(window, self.keep_recent) is not None:
                out, stats = _clear_results(
                    window,
                    self.keep_recent,
                    self.placeholder,
                    self.exclude_tools,
                    counter,
                    session.cleared,
                    self.clear_tool_inputs,
                )
                full = messages if out is window else messages[:start] + out
                # images are counted over the whole history: the newest N may be anywhere
                return _clear_images(full, stats, self.keep_images, counter, session.images)
        return self._run(messages, counter, session.cleared, image_memo=session.images)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        counter = self.counter or default_counter()
        if not self.fires(request, ctx, counter):
            return await call_next(request, ctx)
        messages = request.messages
        session = ctx.state_for(self, _Session)
        new, stats = self._compact(messages, counter, session)
        if new is messages:
            session.remember(messages, self.keep_recent)
            return await call_next(request, ctx)
        after = counter.count_request(request) - stats.freed_tokens
        if stats.freed_tokens < self.clear_at_least or not fits_after(
            after, ctx.config.usable_tokens
        ):
            # not worth breaking the cached prefix: too small a saving, or the request would
            # still overflow (a later call clears these results and more in one batch). The
            # session's mark stays where it was: the results held back are cleared later.
            return await call_next(request, ctx)
        persisted = False
        if self.persist:
            persisted, new = commit(ctx, messages, new, remap_replaced(messages, new))
        session.remember(new, self.keep_recent)
        ctx.emit(MicrocompactApplied.of(stats, persisted=persisted))
        return await call_next(request.evolve(messages=new), ctx)

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        """Clear old tool results, oldest first and short ones last, until ``need`` tokens
        are freed (a guard asks for enough to reach its low-water mark, so this is one batch
        that leaves the newer and the short results alone); ``need <= 0`` clears every one
        it may.
        The guard decides what to commit; this never touches the conversation."""
        new, stats = self._run(messages, counter, need=need if need > 0 else None)
        if stats.changed:
            ctx.emit(MicrocompactApplied.of(stats, source="policy"))
        return Relief(new, stats.freed_tokens, attrs.asdict(stats))
