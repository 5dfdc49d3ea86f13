"""Helpers shared by the compaction layers (tool-result budget, microcompact, summarize).

Config validation in the kernel's style (``ConfigError`` naming field, value and the allowed
range), UTF-8 sizing, the ``metadata["tinyctx"]`` namespace the layers mark messages in, and
mapping a rewritten request history back onto the conversation it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tinyctx import AssistantMessage, ConfigError, Message, RunContext
from tinyctx.config import Check, flag, implements, integer, optional, text
from tinyctx.frozen import FrozenDict, freeze
from tinyctx.tokens import TokenCounter

__all__ = [
    "check_int",
    "check_bool",
    "check_tool_names",
    "check_counter",
    "utf8_len",
    "mark",
    "tinyctx_meta",
    "as_history",
    "protected_from",
    "is_conversation_snapshot",
    "commit",
    "remap_replaced",
]


_FLAG = flag()
_TEXT = text()
# Any iterable, generators included (``each`` refuses one-pass iterators); never a bare str.
_TOOL_NAMES: Check[Iterable[Any]] = Check(
    lambda value: isinstance(value, Iterable) and not isinstance(value, str | bytes),
    "an iterable of tool names, e.g. ('search',)",
)
_COUNTER: Check[TokenCounter | None] = optional(
    implements(TokenCounter),
    allowed="None (the default counter) or a tinyctx.tokens.TokenCounter",
)


def check_int(value: Any, field: str, owner: str, *, minimum: int = 0) -> int:
    """``value`` if it is an int >= ``minimum`` (bools are not ints here), else ConfigError."""
    if type(value) is int and value >= minimum:  # the hot path: no validator built
        return value
    return integer(minimum=minimum).check(value, field, owner)


def check_bool(value: Any, field: str, owner: str) -> bool:
    """``value`` if it is True or False, else ConfigError."""
    return _FLAG.check(value, field, owner)


def check_tool_names(value: Any, field: str, owner: str) -> frozenset[str]:
    """An iterable of tool names; a bare string is refused (``("search",)``, not ``"search"``)."""
    _TOOL_NAMES.check(value, field, owner)
    names = tuple(value)
    for name in names:
        if not _TEXT.test(name):
            raise ConfigError(field, value, "non-empty tool name strings", owner=owner)
    return frozenset(names)


def check_counter(value: Any, owner: str) -> TokenCounter | None:
    return _COUNTER.check(value, "counter", owner)


def utf8_len(text: str) -> int:
    """UTF-8 size of ``text``; a lone surrogate counts 3 bytes (the size of U+FFFD)."""
    if text.isascii():  # O(1) in CPython
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def tinyctx_meta(message: Message) -> Mapping[str, Any]:
    """The message's ``metadata["tinyctx"]`` namespace (empty when absent)."""
    value = message.metadata.get("tinyctx")
    return value if isinstance(value, Mapping) else {}


def mark(metadata: Mapping[str, Any], key: str, value: Mapping[str, Any]) -> FrozenDict[str, Any]:
    """``metadata`` with ``metadata["tinyctx"][key] = value``; every other key is kept.

    Built frozen (``metadata`` is a message's, already deep-frozen), so the message
    converter adopts it without walking it again.
    """
    namespace = metadata.get("tinyctx")
    merged = dict(namespace) if isinstance(namespace, Mapping) else {}
    merged[key] = freeze(value)
    updated = dict(metadata)
    updated["tinyctx"] = FrozenDict(merged)
    return FrozenDict(updated)


def as_history(messages: Sequence[Message]) -> tuple[Message, ...]:
    return messages if type(messages) is tuple else tuple(messages)


def protected_from(history: tuple[Message, ...], keep_recent: int) -> int | None:
    """Index of the oldest of the newest ``keep_recent`` tool-call turns (what a clearing
    layer keeps whole); ``len(history)`` for 0; None when there are fewer."""
    if keep_recent == 0:
        return len(history)
    seen = 0
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, AssistantMessage) and message.tool_calls:
            seen += 1
            if seen == keep_recent:
                return index
    return None


def is_conversation_snapshot(messages: Sequence[Message], ctx: RunContext[Any]) -> bool:
    """Whether ``messages`` is the conversation itself (no outer layer changed the request)."""
    conversation = ctx.conversation.messages
    return messages is conversation or (
        len(messages) == len(conversation)
        and all(a is b for a, b in zip(messages, conversation, strict=True))
    )


Remap = Callable[[tuple[Message, ...]], "tuple[Sequence[Message], bool] | None"]
"""Maps a rewrite onto the conversation's messages: ``(updated, complete)``, or None."""


def remap_replaced(before: tuple[Message, ...], after: tuple[Message, ...]) -> Remap:
    """A :data:`Remap` replacing, in the conversation, the very messages a rewrite of
    ``before`` into ``after`` replaced, one for one (by identity)."""

    def remap(current: tuple[Message, ...]) -> tuple[list[Message], bool] | None:
        changed = {id(old): new for old, new in zip(before, after, strict=True) if old is not new}
        # ids are unique among live objects, and every changed one is alive (``before``)
        updated = [changed.get(id(m), m) for m in current]
        hits = sum(1 for old, new in zip(current, updated, strict=True) if old is not new)
        return (updated, hits == len(changed)) if hits else None

    return remap


def commit(
    ctx: RunContext[Any],
    before: tuple[Message, ...],
    after: tuple[Message, ...],
    remap: Remap,
) -> tuple[bool, tuple[Message, ...]]:
    """Persist a layer's rewrite of the request history ``before`` into ``after``.

    Returns whether the conversation now holds the whole rewrite, and the history to pass
    on. When ``before`` is the conversation snapshot, ``after`` is committed as is and the
    new snapshot is passed on (inner layers see the conversation itself). Otherwise an
    outer layer changed the request: only what ``remap`` can map back is committed, and
    ``after`` is passed on unchanged.
    """
    conversation = ctx.conversation
    if is_conversation_snapshot(before, ctx):
        conversation.replace(after, emit_new=False)
        return True, conversation.messages
    mapped = remap(conversation.messages)
    if mapped is None:
        return False, after
    updated, complete = mapped
    conversation.replace(updated, emit_new=False)
    return complete, after
