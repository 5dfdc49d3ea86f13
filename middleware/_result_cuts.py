"""Cutting one tool result to a byte budget on a UTF-8 character boundary, with a marker
that says what was dropped: the pure pieces :mod:`.tool_result_budget` builds on."""

from __future__ import annotations

import functools
import re

from attrs import frozen

from tinyctx.config import one_of

from ._compaction import check_int, utf8_len

DEFAULT_BUDGET_BYTES = 16384
DEFAULT_HINT = "call the tool again with a narrower query, a range or an offset to see the rest"

_SURROGATE = re.compile("[\ud800-\udfff]")


@frozen
class TruncationStats:
    """What budgeting one result did. ``final_bytes <= budget`` whenever ``truncated``."""

    original_bytes: int
    final_bytes: int
    truncated: bool
    kept_bytes: int
    """Bytes of the original content kept (in front of the marker when truncated)."""

    @property
    def dropped_bytes(self) -> int:
        """Bytes of the original content that are not in the result."""
        return self.original_bytes - self.kept_bytes


@functools.lru_cache(maxsize=256)
def _untouched(size: int) -> TruncationStats:
    # frozen, so shared: a search reports most results untouched at every probe
    return TruncationStats(size, size, False, size)


def _cut(data: bytes, limit: int) -> int:
    """The largest ``k <= limit`` such that ``data[:k]`` ends on a UTF-8 character boundary."""
    if limit >= len(data):
        return len(data)
    k = max(limit, 0)
    # data[k] is the first byte left out: a continuation byte (10xxxxxx) means the cut
    # would split a character, so back off to that character's lead byte
    while k > 0 and (data[k] & 0xC0) == 0x80:
        k -= 1
    return k


KEEPS = ("head", "middle")
"""What a cut keeps: ``head`` the start (the marker at the end), ``middle`` the start and
the end, half each (the marker where the middle was)."""


def _markers(dropped: int, total: int, hint: str, keep: str = "head") -> tuple[str, str, str]:
    """The markers from most to least informative; the last one is cut when nothing fits."""
    how = f"; {hint}" if hint else ""
    if keep == "middle":
        return (
            f"\n[truncated: {dropped} of {total} bytes dropped from the middle{how}]\n",
            f"[+{dropped}B cut]",
            "[cut]",
        )
    return (
        f"\n[truncated: {dropped} of {total} bytes dropped{how}]",
        f"[+{dropped}B cut]",
        "[cut]",
    )


def _check_keep(keep: object, owner: str) -> str:
    return one_of(KEEPS, allowed=f"one of {KEEPS}").check(keep, "keep", owner)


def budget_tool_result(
    content: str, budget_bytes: int, *, hint: str = DEFAULT_HINT, keep: str = "head"
) -> tuple[str, TruncationStats]:
    """``content`` capped at ``budget_bytes`` UTF-8 bytes, and what was done.

    Over budget, the kept prefix is cut on a character boundary and followed by a marker
    naming the dropped byte count and ``hint`` (how to see the rest); with
    ``keep="middle"`` the kept bytes are the start and the end, half each, and the marker
    stands where the middle was (a file's last lines and a log's final error survive). The
    result is valid UTF-8 (a lone surrogate, which is not, becomes U+FFFD of the same size)
    and never longer than ``budget_bytes``. ``budget_bytes == 0`` returns ``content`` as is.
    """
    check_int(budget_bytes, "budget_bytes", "budget_tool_result")
    _check_keep(keep, "budget_tool_result")
    return _cut_text(content, budget_bytes, hint, keep)


_Encodings = dict[int, tuple[str, str, bytes | None, int]]
"""id(text) -> (the text, the text to cut, its UTF-8 bytes, their size), for one search."""


def _utf8(content: str, keep: str) -> tuple[str, bytes | None, int]:
    """The text to cut (lone surrogates replaced), its UTF-8 bytes and their size. An ASCII
    text cut at its head needs no bytes (None): one byte per character, every cut on a
    boundary, so the text itself is sliced."""
    if content.isascii():
        return content, (None if keep == "head" else content.encode("ascii")), len(content)
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        content = _SURROGATE.sub("\ufffd", content)
        data = content.encode("utf-8")
    return content, data, len(data)


def _cut_text(
    content: str, budget_bytes: int, hint: str, keep: str, known: _Encodings | None = None
) -> tuple[str, TruncationStats]:
    """:func:`budget_tool_result` of settings already checked. A shrink's search budgets a
    history's results a dozen times over: ``known`` keeps each text's encoding meanwhile."""
    if budget_bytes == 0:
        return content, _untouched(utf8_len(content))
    if content.isascii() and len(content) <= budget_bytes:
        return content, _untouched(len(content))
    entry = None if known is None else known.get(id(content))
    if entry is None or entry[0] is not content:
        entry = (content, *_utf8(content, keep))
        if known is not None:
            known[id(content)] = entry  # the entry holds the text: its id stays its own
    _, content, data, total = entry
    if total <= budget_bytes:
        return content, _untouched(total)
    # the dropped count is at most ``total``: a marker rendered with it is the longest one,
    # so the real marker (with fewer or as many digits) fits wherever this one fits
    for rank, longest in enumerate(_markers(total, total, hint, keep)):
        size = utf8_len(longest)
        if size <= budget_bytes:
            if data is None:
                kept = budget_bytes - size
            else:
                kept = _cut(data, budget_bytes - size)
                if keep == "middle":
                    return _middle(data, kept, hint, rank)
            marker = _markers(total - kept, total, hint)[rank]
            break
    else:
        # not even "[cut]" fits: cut the marker, never the guarantee
        kept = 0
        marker = longest[:budget_bytes]
    head = content[:kept] if data is None else data[:kept].decode("utf-8")
    text = head + marker
    return text, TruncationStats(total, kept + utf8_len(marker), True, kept)


def _middle(data: bytes, kept: int, hint: str, rank: int) -> tuple[str, TruncationStats]:
    """``kept`` bytes of ``data``, the first and the last half, around the marker of
    ``rank`` (sized for the largest dropped count, so the real one fits)."""
    total = len(data)
    head = _cut(data, kept // 2)
    start = total - (kept - head)
    while start < total and (data[start] & 0xC0) == 0x80:
        start += 1  # never start the tail inside a character
    dropped = start - head
    marker = _markers(dropped, total, hint, "middle")[rank]
    text = data[:head].decode("utf-8") + marker + data[start:].decode("utf-8")
    tail = total - start
    return text, TruncationStats(total, head + tail + utf8_len(marker), True, head + tail)
