"""The default heuristic counter: memoized per message, counts every part of a request."""

from __future__ import annotations

from tinyctx import (
    AssistantMessage,
    HeuristicCounter,
    ModelRequest,
    TokenCounter,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserMessage,
    default_counter,
)


class TestHeuristicCounter:
    """Counts text, tool calls, schemas and the system prompt; re-counts are lookups."""

    def test_counts_grow_with_content(self) -> None:
        counter = HeuristicCounter()
        assert isinstance(counter, TokenCounter)
        assert counter.count_text("") == 0
        assert counter.count_text("abcd" * 100) == 100
        short = counter.count_message(UserMessage("hi"))
        long = counter.count_message(UserMessage("hi " * 400))
        assert long > short > 0
        call = AssistantMessage("", (ToolCall("c1", "search", {"q": "x" * 400}),))
        assert counter.count_message(call) > counter.count_message(AssistantMessage(""))
        assert counter.count_message(ToolResult("c1", "r" * 40)) >= 10

    def test_request_counts_system_prompt_and_tools(self) -> None:
        counter = default_counter()
        bare = ModelRequest(messages=(UserMessage("hello"),))
        full = bare.evolve(
            system_prompt="You are helpful. " * 20,
            tools=(ToolSpec("search", "Search the web", {"type": "object"}),),
        )
        assert counter.count_request(full) > counter.count_request(bare)

    def test_memo_is_keyed_by_the_message_object(self) -> None:
        counter = HeuristicCounter()
        message = UserMessage("x" * 40)
        assert counter.count_message(message) == counter.count_message(message)
        assert counter._memo[id(message)][0] is message
        small = HeuristicCounter(max_memo=2)
        for i in range(5):
            small.count_message(UserMessage(str(i)))
        assert len(small._memo) <= 2
