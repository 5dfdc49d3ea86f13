"""The Stack every integration drives: layers composed once around the framework's handler,
per-thread layer state, and the persistent / transient split it reports."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import AssistantMessage, ConfigError, ModelRequest, ModelResponse, UserMessage
from tinyctx.integrations import Stack


async def _answer(request: ModelRequest) -> ModelResponse:
    return ModelResponse(AssistantMessage(f"saw {len(request.messages)}"))


class TestStack:
    """Stack runs layers around a framework call and reports what they committed."""

    async def test_a_transient_rewrite_commits_nothing(self) -> None:
        """A layer that only changes the request leaves `committed` None."""

        async def drop_first(request: Any, ctx: Any, call_next: Any) -> Any:
            return await call_next(request.evolve(messages=request.messages[1:]), ctx)

        outcome = await Stack([drop_first]).call_model(
            "t", [UserMessage("a"), UserMessage("b")], _answer
        )
        assert outcome.response.text == "saw 1"
        assert outcome.committed is None

    async def test_a_persistent_rewrite_is_reported(self) -> None:
        """A layer that replaces the conversation reports the committed history."""

        async def commit(request: Any, ctx: Any, call_next: Any) -> Any:
            kept = request.messages[1:]
            ctx.conversation.replace(kept, emit_new=False)
            return await call_next(request.evolve(messages=kept), ctx)

        outcome = await Stack([commit]).call_model(
            "t", [UserMessage("a"), UserMessage("b")], _answer
        )
        assert outcome.committed == (UserMessage("b"),)

    async def test_thread_state_is_kept_for_the_newest_threads(self) -> None:
        """At most max_threads contexts are kept, the least recently used dropped first."""
        stack = Stack([], max_threads=2)
        first = stack.context("a")
        stack.context("b")
        assert stack.context("a") is first  # "a" is now the most recent
        stack.context("c")  # evicts "b"
        assert stack.context("a") is first
        assert sorted(stack._threads) == ["a", "c"]

    def test_bad_settings_name_the_field(self) -> None:
        """A bad max_threads or window fails at construction naming the field."""
        with pytest.raises(ConfigError, match="max_threads"):
            Stack([], max_threads=0)
        with pytest.raises(ConfigError, match="reserved_output_tokens"):
            Stack([], max_tokens=100, reserved_output_tokens=100)
