"""Summarizing a history.

Where the cut falls, the transcript a summarizer reads, and the one call that asks it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from attrs import frozen

from tinyctx import (
    AssistantMessage,
    Interrupted,
    Message,
    RunCancelled,
    RunContext,
    SystemMessage,
    TinyCtxError,
    ToolResult,
    UserMessage,
)
from tinyctx.forgetting import find_spans, searchable_text
from tinyctx.frozen import thaw
from tinyctx.messages import snap_boundary
from tinyctx.parts import TextPart, describe_part
from tinyctx.tokens import TokenCounter, default_counter

from ._compaction import (
    as_history,
    check_int,
    tinyctx_meta,
)

SUMMARY_PREFIX = "[auto-compacted] Summary of {count} earlier messages:"

REFERENCES_HEADING = "References kept verbatim (newest first):"
"""The line the references section of a span-carrying summary starts with."""

REFERENCE_KINDS = ("path", "identifier", "number", "hex")
"""The span rules of :mod:`tinyctx.forgetting` whose spans a summary's references carry."""

DEFAULT_SUMMARY_PROMPT = """\
You compact the earlier part of a conversation between a user and an AI agent that uses \
tools, so the agent can continue the work without it. Write a dense summary that keeps:
- the user's goals, requests and constraints, in their own words where it matters;
- decisions made, and why;
- facts found through tools: file paths, names, identifiers, numbers, commands, errors and \
results, exactly as they appeared;
- what has been done so far;
- open work: what is unfinished, pending questions and the next steps.
Use short headed sections or bullet points. Never invent anything, never address the user, \
and write no preamble: output the summary only."""


class SummarizationError(TinyCtxError):
    """The summarizer failed or returned no text; the history was left as it was."""


@runtime_checkable
class Summarizer(Protocol):
    """Writes the summary text of ``messages`` (the part of the history being replaced)."""

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str: ...


@frozen
class SummaryStats:
    """What one summarization did; ``summarized == 0`` when it did nothing."""

    summarized: int = 0
    """Messages replaced by the summary."""
    kept: int = 0
    """Messages kept verbatim (leading and inner system messages, and the tail)."""
    lead: int = 0
    """Index in the input where the summarized part starts (after leading system messages)."""
    split: int = 0
    """Index in the input where the verbatim tail starts; the summary is just before it."""
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def freed_tokens(self) -> int:
        return self.tokens_before - self.tokens_after

    @property
    def changed(self) -> bool:
        return self.summarized > 0


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a summary written by :func:`summarize_history`."""
    # most messages carry no tinyctx metadata: skip the namespace lookup for them
    return message.metadata.get("tinyctx") is not None and "summary" in tinyctx_meta(message)


def _stack(history: Sequence[Message], lead: int, keep_summaries: int) -> tuple[int, int]:
    """``(lead, fold)`` for the summaries that follow ``history[:lead]``: when there are at
    most ``keep_summaries`` of them they stay in front (``lead`` moves past them, ``fold``
    is the new lead), else they are all folded into the next summary (``lead`` stays,
    ``fold`` is where they end: the summarized part reaches at least there)."""
    end = lead
    while end < len(history) and is_summary(history[end]):
        end += 1
    return (end, end) if end - lead <= keep_summaries else (lead, end)


def _system_lead(history: Sequence[Message]) -> int:
    """How many system messages the history starts with."""
    lead = 0
    while lead < len(history) and isinstance(history[lead], SystemMessage):
        lead += 1
    return lead


def _may_be_task(message: Message) -> bool:
    """Whether ``message``, first after the system messages, is a task a summary can keep
    in front of it: a user message that is not itself a summary."""
    return isinstance(message, UserMessage) and not is_summary(message)


def digest_end(history: Sequence[Message]) -> int:
    """Where the digest a summarized history starts with ends: the leading system messages,
    the task kept in front of the summaries (``keep_task``), the summaries (and system
    messages among them); 0 when the history does not start with one. A trim keeps it
    until the raw turns after it are gone (:func:`~tinyctx.middleware.trim.trim_oldest`)."""
    index, n = _system_lead(history), len(history)
    if index < n and _may_be_task(history[index]):
        index += 1
    end = 0
    while index < n:
        message = history[index]
        if is_summary(message):
            end = index + 1
        elif not isinstance(message, SystemMessage):
            break
        index += 1
    return end


def summary_split(
    history: Sequence[Message],
    keep_recent: int = 10,
    *,
    keep_task: bool = False,
    forward: bool = False,
    keep_summaries: int = 0,
) -> tuple[int, int] | None:
    """``(lead, split)``: ``history[lead:split]`` is what a summary replaces, or None.

    ``lead`` counts the leading system messages, and with ``keep_task`` the first user
    message after them too (the task, kept verbatim in front of the summary, unless it is
    itself a summary), and then the earlier summaries that follow when there are at most
    ``keep_summaries`` of them (more: they are all summarized again, folded into the new
    one, whatever ``keep_recent`` says); ``split`` is ``len - keep_recent`` moved back to
    the nearest cut that separates no tool call from its results (a call waiting for its
    results at the end included), or with ``forward`` on to the next such cut when one comes
    before the end (the tail then holds at most ``keep_recent`` messages). None when the
    history is not longer than ``keep_recent`` or nothing but system messages would go.

    Only the last tool-call turn before the target can straddle it (results come before
    the next assistant message), so the split walks back from the target to that turn's
    assistant message and on to the next one (:func:`_clean_cut`): the cost is that
    distance, not the history (``forward`` still snaps over the whole history).

    Args:
        history: The messages to split.
        keep_recent: Messages the tail keeps.
        keep_task: Keep the first user message in the lead.
        forward: Snap the cut forward to the next clean cut before the end.
        keep_summaries: The most earlier summaries kept in the lead.
    """
    if (  # the hot path checks inline; a bad value gets the validators' ConfigError
        type(keep_recent) is not int
        or type(keep_summaries) is not int
        or keep_recent < 0
        or keep_summaries < 0
    ):
        check_int(keep_recent, "keep_recent", "summary_split")
        check_int(keep_summaries, "keep_summaries", "summary_split")
    count = len(history)
    if count <= keep_recent:
        return None
    lead = 0
    while isinstance(history[lead], SystemMessage):
        lead += 1
        if lead == count:
            return None  # nothing but system messages
    if keep_task and lead < count and _may_be_task(history[lead]):
        lead += 1
    fold = lead
    if lead < count and history[lead].metadata.get("tinyctx") is not None:
        lead, fold = _stack(history, lead, keep_summaries)
    target = count - keep_recent
    if target < fold:
        target = fold
    if target <= lead:
        return None
    if forward:
        ahead = snap_boundary(history, target, direction="forward")
        if ahead < count:
            target = ahead
    window = target - 1
    while window >= 0 and not isinstance(history[window], AssistantMessage):
        window -= 1
    # a cut before an assistant message separates nothing: back to it unless the target is clean
    split = target if window < 0 or _clean_cut(history, window, target) else window
    if split <= lead:
        return None
    if not isinstance(history[lead], SystemMessage):
        return lead, split
    for index in range(lead + 1, split):
        if not isinstance(history[index], SystemMessage):
            return lead, split
    return None


def _clean_cut(history: Sequence[Message], turn: int, cut: int) -> bool:
    """Whether cutting before ``cut`` leaves every call of ``history[turn]`` (the last
    assistant message before the cut) with its results: none comes at or after the cut
    (results come before the next assistant message), and when no assistant message
    follows, none is still waiting. The walk stops at the next assistant message, so it
    costs the distance to the cut's turn, not the history."""
    count = len(history)
    if cut >= count or isinstance(history[cut], AssistantMessage):
        return True
    last = history[turn]
    calls = last.tool_calls if isinstance(last, AssistantMessage) else ()
    if not calls:
        return True
    ids: set[str] | None = None  # built only when a result follows the cut
    for index in range(cut, count):
        message = history[index]
        if isinstance(message, AssistantMessage):
            return True
        if isinstance(message, ToolResult):
            ids = ids or {call.id for call in calls}
            if message.tool_call_id in ids:
                return False
    answered = {m.tool_call_id for m in history[turn + 1 : cut] if isinstance(m, ToolResult)}
    return {call.id for call in calls} <= answered


async def summarize_history(
    history: Sequence[Message],
    summarizer: Summarizer,
    ctx: RunContext[Any],
    keep_recent: int = 10,
    *,
    counter: TokenCounter | None = None,
    keep_task: bool = False,
    forward: bool = False,
    keep_summaries: int = 0,
    references: int = 0,
) -> tuple[tuple[Message, ...], SummaryStats]:
    """Replace the older part of ``history`` with one summary message.

    ``keep_task``, ``forward`` and ``keep_summaries`` choose the split as
    :func:`summary_split` does. ``references`` (tokens; 0: none) ends the summary with the
    spans of the summarized messages that neither the summary text nor the kept messages
    hold, verbatim (:func:`summary_references`), so a later use of a path or an
    identifier still finds it.

    Returns the input tuple itself (and no summarizer call is made) when there is nothing
    to summarize. Raises :class:`SummarizationError` when the summarizer fails or returns
    only whitespace; cancellation and interrupts propagate as they are. Either way the
    input is not changed.

    Args:
        history: The messages to shorten.
        summarizer: Writes the summary.
        ctx: The run's context (the summarizer's calls are its children).
        keep_recent: Messages kept verbatim at the end.
        counter: Counts the summary's stats; default :func:`~tinyctx.tokens.default_counter`.
        keep_task: Keep the first user message verbatim (see :func:`summary_split`).
        forward: Snap the cut forward rather than back (see :func:`summary_split`).
        keep_summaries: Earlier summaries kept verbatim (see :func:`summary_split`).
        references: The most tokens the references section takes (0: no section).
    """
    check_int(references, "references", "summarize_history")
    history = as_history(history)
    plan = summary_split(
        history, keep_recent, keep_task=keep_task, forward=forward, keep_summaries=keep_summaries
    )
    if plan is None:
        return history, SummaryStats(kept=len(history))
    lead, split = plan
    head = history[lead:split]
    inner_system = tuple(m for m in head if isinstance(m, SystemMessage))
    replaced = tuple(m for m in head if not isinstance(m, SystemMessage)) if inner_system else head
    text = await _ask(summarizer, replaced, ctx)
    counter = counter or default_counter()
    kept = (*history[:lead], *inner_system, *history[split:])
    present = "\x00".join((text, *map(searchable_text, kept)))
    carried = summary_references(replaced, present, references, counter)
    record: dict[str, Any] = {"messages": len(replaced), "summarizer": type(summarizer).__name__}
    if carried:
        record["references"] = len(carried)
        text = f"{text}\n{REFERENCES_HEADING}\n{' '.join(carried)}"
    summary = UserMessage(
        f"{SUMMARY_PREFIX.format(count=len(replaced))}\n{text}",
        metadata={"tinyctx": {"summary": record}},
    )
    new = (*history[:lead], *inner_system, summary, *history[split:])
    count_messages = counter.count_messages
    stats = SummaryStats(
        summarized=len(replaced),
        kept=len(new) - 1,
        lead=lead,
        split=split,
        tokens_before=count_messages(history),
        tokens_after=count_messages(new),
    )
    return new, stats


def summary_references(
    messages: Sequence[Message], present: str, budget: int, counter: TokenCounter
) -> tuple[str, ...]:
    """The spans (:data:`REFERENCE_KINDS` of :func:`tinyctx.forgetting.find_spans`) of
    ``messages`` that ``present`` (the summary text and the kept messages) does not hold:
    newest message first, within one in the order ``find_spans`` finds them, each once
    (none inside one chosen before), while the section (with :data:`REFERENCES_HEADING`)
    stays within ``budget`` tokens. Deterministic: the same messages give the same
    references."""
    if budget <= 0:
        return ()
    count_text = counter.count_text
    room = budget - count_text(REFERENCES_HEADING) - 1
    chosen: list[str] = []
    joined = ""
    for message in reversed(messages):
        if room < 1:
            break  # every span costs at least its separator: none fits any more
        for span in find_spans(searchable_text(message)):
            if span.kind not in REFERENCE_KINDS or span.text in joined:
                continue
            cost = count_text(span.text) + 1
            if cost > room or span.text in present:
                continue
            chosen.append(span.text)
            joined = f"{joined}\x00{span.text}"
            room -= cost
    # estimates of parts need not add up to the estimate of the whole: make sure
    while chosen and count_text(f"{REFERENCES_HEADING}\n{' '.join(chosen)}") > budget:
        chosen.pop()
    return tuple(chosen)


async def _ask(summarizer: Summarizer, messages: tuple[Message, ...], ctx: RunContext[Any]) -> str:
    """The summary text, raced against the run's cancellation; errors become one type."""
    try:
        text = await ctx.cancellation.race(lambda: summarizer.summarize(messages, ctx), "summarize")
    except (RunCancelled, Interrupted):
        raise
    except SummarizationError:
        raise
    except Exception as exc:
        raise SummarizationError(
            f"{type(summarizer).__name__} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(text, str):
        raise SummarizationError(
            f"{type(summarizer).__name__} returned {type(text).__name__}, expected str"
        )
    text = text.strip()
    if not text:
        raise SummarizationError(f"{type(summarizer).__name__} returned an empty summary")
    return text


# ---------------------------------------------------------------------------------------
# transcripts


def _squash(text: str) -> str:
    return " ".join(text.split())


def _middle_cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, its middle replaced by a note."""
    if len(text) <= limit:
        return text
    note = f" [... {len(text) - limit} characters omitted ...] "
    keep = max(limit - len(note), 0)
    head = keep * 2 // 5
    return text[:head] + note + text[len(text) - (keep - head) :] if keep else text[:limit]


def _described(message: Message, limit: int) -> str:
    """A message's :meth:`~tinyctx.Message.describe` within about ``limit`` characters: its
    text is cut in the middle, an image or a document is named whole (its URL too: a URL
    cut short could not be fetched again)."""
    content = getattr(message, "content", "")
    if isinstance(content, str):
        return _middle_cut(content, limit)
    texts = sum(1 for part in content if isinstance(part, TextPart)) or 1
    return "\n".join(
        _middle_cut(part.text, limit // texts)
        if isinstance(part, TextPart)
        else describe_part(part)
        for part in content
    )


def _arguments(arguments: Mapping[str, Any]) -> str:
    return json.dumps(thaw(arguments), ensure_ascii=False, sort_keys=True, default=str)


def _render(message: Message, limit: int) -> str:
    """One message as a transcript block: role, tool calls with arguments, results."""
    if isinstance(message, ToolResult):
        label = f"tool result {message.name}".rstrip() + (" (error)" if message.is_error else "")
        if "cleared" in tinyctx_meta(message):
            return f"[{label}] (content cleared earlier)"
        return f"[{label}] {_described(message, limit)}"
    if isinstance(message, AssistantMessage):
        lines = [f"[assistant] {_middle_cut(message.content, limit)}"] if message.content else []
        for call in message.tool_calls:
            args = _middle_cut(_arguments(call.arguments), limit)
            lines.append(f"[assistant calls {call.name}] {args}")
        return "\n".join(lines) or "[assistant] (no text)"
    return f"[{message.role}] {_described(message, limit)}"


def render_transcript(
    messages: Sequence[Message],
    *,
    max_tokens: int,
    counter: TokenCounter | None = None,
    block_chars: int = 6000,
    head_share: float = 0.3,
) -> str:
    """The messages as a plain-text transcript within about ``max_tokens``.

    Each message is one block (role, text, tool calls with their arguments, results),
    capped at ``block_chars`` by cutting its middle. When the whole does not fit, blocks are
    dropped from the middle of the transcript, not its end: up to ``head_share`` of the
    budget keeps the oldest blocks (where the goals are stated), the rest the newest, and a
    note says how many messages were left out. The first and the last message always
    appear, cut in their middle when they alone are too long.

    Args:
        messages: The messages to render.
        max_tokens: About the most the transcript takes.
        counter: Counts the blocks; default :func:`~tinyctx.tokens.default_counter`.
        block_chars: The longest block, in characters.
        head_share: The share of ``max_tokens`` kept for the oldest blocks.
    """
    count_text = (counter or default_counter()).count_text
    blocks = [_render(m, block_chars) for m in messages]
    sizes = [count_text(b) + 1 for b in blocks]
    if sum(sizes) <= max_tokens:
        return "\n".join(blocks)
    note_tokens = 16

    def squeeze(index: int, room: int) -> str | None:
        chars = len(blocks[index]) * room // max(sizes[index], 1)
        return _middle_cut(blocks[index], chars) if chars >= 64 else None

    first: list[str] = []
    start, used = 0, 0
    head_budget = int(max_tokens * head_share)
    while start < len(blocks) - 1 and used + sizes[start] <= head_budget:
        first.append(blocks[start])
        used += sizes[start]
        start += 1
    if not first and (cut := squeeze(0, head_budget)) is not None:
        first.append(cut)
        used = head_budget
        start = 1
    last: list[str] = []
    end = len(blocks)
    room = max_tokens - used - note_tokens
    while end > start:
        size = sizes[end - 1]
        if size <= room:
            last.append(blocks[end - 1])
            room -= size
            end -= 1
            continue
        if not last and (cut := squeeze(end - 1, room)) is not None:
            last.append(cut)
            end -= 1
        break
    omitted = end - start
    middle = [f"[... {omitted} messages omitted from the middle ...]"] if omitted else []
    return "\n".join([*first, *middle, *reversed(last)])
