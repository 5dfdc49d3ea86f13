"""What a provider will clear from a request, by its documented rules, estimated locally.

A provider-side layer (:class:`~tinyctx.providers.anthropic_context.AnthropicContextEditing`,
:class:`~tinyctx.providers.anthropic_compaction.AnthropicCompaction`,
:class:`~tinyctx.providers.openai_compact.ResponsesCompact`) puts its rule on the requests it
passes inward (:func:`declare`, under ``request.metadata[PROVIDER_CLEARING]``). A budget
guard inside it asks :func:`provider_cleared` how many tokens those rules will take from
the request it measures, and does not act on them itself: it compacts only when what is
left after the provider's clearing still passes its trigger. The same rules drive the
estimated provider stacks of ``tinyctx replay`` (:mod:`tinyctx.providers.estimates`).

The rules (Anthropic's context-editing and compaction docs; OpenAI's ``responses.compact``):

- :class:`ClearToolUses` (``clear_tool_uses_20250919``): once the prompt passes
  ``trigger`` input tokens, every tool result but the newest ``keep`` is replaced by a
  short placeholder (results of ``exclude_tools`` are never cleared; with
  ``clear_tool_inputs`` the calls' arguments go too). When that frees fewer than
  ``clear_at_least`` tokens the edit is not applied at all.
- :class:`Compaction` (``compact_20260112``, and ``responses.compact`` with
  ``keep_recent``): once the prompt passes ``trigger``, the messages before the newest
  ``keep_recent`` become one summary of about ``summary_tokens`` (the provider's summary
  length is not documented: an estimate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

import attrs
from attrs import frozen

from ..context import RunContext
from ..events import Event, EventLevel
from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResult,
    UserMessage,
    snap_boundary,
)
from ..model import ModelRequest
from ..tokens import TokenCounter

__all__ = [
    "PROVIDER_CLEARING",
    "CLEARED_PLACEHOLDER",
    "ClearingRule",
    "ClearToolUses",
    "Compaction",
    "ProviderCompacted",
    "declare",
    "provider_cleared",
    "is_conversation",
]

PROVIDER_CLEARING: Final = "tinyctx.provider_clearing"
"""The ``request.metadata`` key holding the provider-side rules declared for a request."""

CLEARED_PLACEHOLDER: Final = "[tool result cleared by the provider]"


@frozen
class ProviderCompacted(Event):
    """The provider compacted the head of the history: ``messages_before`` messages became
    ``messages_after`` (what it keeps and its compaction). ``estimated``: a local estimate of
    the provider's documented rule (``tinyctx replay``), not the provider's answer."""

    kind: ClassVar[str] = "compaction.provider"
    level: ClassVar[EventLevel] = "info"
    provider: str = "openai"
    layer: str = "ResponsesCompact"
    messages_before: int = 0
    messages_after: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    freed_tokens: int = 0
    persisted: bool = False
    estimated: bool = False
    provider_input_tokens: int = 0
    """What the provider's compaction step itself read and wrote, when it reports it."""
    provider_output_tokens: int = 0

    def describe(self) -> str:
        what = "estimate: " if self.estimated else ""
        return (
            f"{self.kind}({what}{self.provider}: {self.messages_before} -> "
            f"{self.messages_after} messages, freed={self.freed_tokens})"
        )


@runtime_checkable
class ClearingRule(Protocol):
    """A provider's rule: the tokens it will clear from a request, by a counter's count."""

    def cleared(self, request: ModelRequest, counter: TokenCounter) -> int: ...


def _count(request: ModelRequest, messages: Sequence[Message], counter: TokenCounter) -> int:
    return counter.count_request(request.evolve(messages=tuple(messages)))


@frozen
class ClearToolUses:
    """Anthropic's ``clear_tool_uses_20250919`` (see the module docstring)."""

    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int | None = None
    exclude_tools: frozenset[str] = frozenset()
    clear_tool_inputs: bool = False

    def apply(self, messages: Sequence[Message]) -> tuple[tuple[Message, ...], int]:
        """``messages`` as the provider edits them (the trigger aside), and how many tool
        uses that clears."""
        results = [
            i
            for i, m in enumerate(messages)
            if isinstance(m, ToolResult)
            and m.name not in self.exclude_tools
            and m.content != CLEARED_PLACEHOLDER
        ]
        cleared = set(results[: max(0, len(results) - self.keep)])
        if not cleared:
            return tuple(messages), 0
        ids = {
            m.tool_call_id
            for i, m in enumerate(messages)
            if i in cleared and isinstance(m, ToolResult)
        }
        edited: list[Message] = []
        for index, message in enumerate(messages):
            if index in cleared:
                message = message.evolve(content=CLEARED_PLACEHOLDER, metadata={})
            elif self.clear_tool_inputs and isinstance(message, AssistantMessage):
                calls = tuple(
                    attrs.evolve(c, arguments={}) if c.id in ids else c for c in message.tool_calls
                )
                if calls != message.tool_calls:
                    message = message.evolve(tool_calls=calls, metadata={})
            edited.append(message)
        return tuple(edited), len(cleared)

    def edit(
        self, request: ModelRequest, counter: TokenCounter
    ) -> tuple[tuple[Message, ...], int, int]:
        """The request's messages after the edit, the tool uses and the tokens it clears
        (the messages unchanged and zeros when the edit does not apply)."""
        before = counter.count_request(request)
        if before < self.trigger:
            return request.messages, 0, 0
        edited, uses = self.apply(request.messages)
        freed = before - _count(request, edited, counter) if uses else 0
        if freed <= 0 or (self.clear_at_least is not None and freed < self.clear_at_least):
            return request.messages, 0, 0
        return edited, uses, freed

    def cleared(self, request: ModelRequest, counter: TokenCounter) -> int:
        return self.edit(request, counter)[2]


@frozen
class Compaction:
    """A provider's compaction past ``trigger`` (see the module docstring)."""

    trigger: int = 150_000
    summary_tokens: int = 2_000
    keep_recent: int = 0
    keep_user_messages: bool = False
    """OpenAI's ``responses.compact`` keeps the user messages of the head; Anthropic's
    compaction keeps none."""

    def split(self, messages: Sequence[Message]) -> int:
        """Where the compacted head ends: before the newest ``keep_recent`` messages, never
        parting a call from its result."""
        return snap_boundary(tuple(messages), len(messages) - self.keep_recent)

    def kept(self, head: Sequence[Message]) -> tuple[Message, ...]:
        """What of the compacted head the provider keeps beside its summary."""
        keep = (SystemMessage, UserMessage) if self.keep_user_messages else (SystemMessage,)
        return tuple(m for m in head if isinstance(m, keep))

    def cleared(self, request: ModelRequest, counter: TokenCounter) -> int:
        before = counter.count_request(request)
        cut = self.split(request.messages)
        if before < self.trigger or cut == 0:
            return 0
        head = request.messages[:cut]
        kept = self.kept(head)
        freed = counter.count_messages(head) - counter.count_messages(kept) - self.summary_tokens
        return max(0, freed)


def is_conversation(messages: Sequence[Message], ctx: RunContext[Any]) -> bool:
    """Whether ``messages`` are the conversation's own (no outer layer changed them), so a
    provider's compaction of them can be committed to it."""
    conversation = ctx.conversation.messages
    return len(conversation) == len(messages) and all(
        a is b for a, b in zip(conversation, messages, strict=True)
    )


def declare(request: ModelRequest, rule: ClearingRule) -> ModelRequest:
    """``request`` with ``rule`` added to the provider-side rules it carries."""
    rules = request.metadata.get(PROVIDER_CLEARING, ())
    return request.with_metadata({PROVIDER_CLEARING: (*rules, rule)})


def provider_cleared(request: ModelRequest, counter: TokenCounter) -> int:
    """The tokens the provider-side rules declared on ``request`` will clear from it (each
    rule measured on the request as given; their sum, capped at the request's count)."""
    rules: Any = request.metadata.get(PROVIDER_CLEARING, ())
    if not rules:
        return 0
    total = sum(rule.cleared(request, counter) for rule in rules if isinstance(rule, ClearingRule))
    return min(total, counter.count_request(request))
