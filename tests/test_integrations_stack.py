"""The Stack every integration drives: layers composed once around the framework's handler,
per-thread layer state, and the persistent / transient split it reports."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _fresh(messages: tuple[Any, ...]) -> list[Any]:
    """The history as a framework hands it over: equal messages, new objects."""
    return [attrs.evolve(m) for m in messages]


class TestHistoryReuse:
    """A thread the framework re-sends (converted anew each call) keeps its messages as
    the objects the layers saw before, so identity-keyed state stays warm."""

    async def test_an_unchanged_history_is_the_same_tuple(self) -> None:
        stack = Stack([])
        history = (UserMessage("a"), AssistantMessage("b"), UserMessage("c"))
        await stack.call_model("t", history, _answer)
        kept = stack.context("t").conversation.messages
        await stack.call_model("t", _fresh(history), _answer)
        assert stack.context("t").conversation.messages is kept

    async def test_a_grown_history_keeps_the_known_prefix(self) -> None:
        """The equal prefix is the old objects, the new messages are the framework's."""
        stack = Stack([])
        history = (UserMessage("a"), AssistantMessage("b"))
        await stack.call_model("t", history, _answer)
        kept = stack.context("t").conversation.messages
        added = UserMessage("c")
        await stack.call_model("t", [*_fresh(history), added], _answer)
        now = stack.context("t").conversation.messages
        assert now == (*history, added)
        assert all(a is b for a, b in zip(now, kept, strict=False))
        assert now[-1] is added

    @settings(max_examples=40)
    @given(
        before=st.lists(st.sampled_from("abcd"), max_size=6),
        after=st.lists(st.sampled_from("abcd"), max_size=6),
    )
    async def test_what_is_sent_is_always_the_framework_history(
        self, before: list[str], after: list[str]
    ) -> None:
        """Whatever the two histories, the call sees exactly the second (reuse changes
        which objects, never what they say)."""
        stack = Stack([])
        seen: list[tuple[Any, ...]] = []

        async def record(request: ModelRequest) -> ModelResponse:
            seen.append(request.messages)
            return await _answer(request)

        await stack.call_model("t", [UserMessage(t) for t in before], record)
        await stack.call_model("t", [UserMessage(t) for t in after], record)
        assert seen[-1] == tuple(UserMessage(t) for t in after)
