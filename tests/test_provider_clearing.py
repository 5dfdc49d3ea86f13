"""Provider-side rules (tinyctx.providers.clearing): what Anthropic's documented edits clear,
and the budget guard leaving to the provider what it will clear."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_message,
    json_reply,
)
from tinyctx import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from tinyctx.agent import Agent, Session
from tinyctx.messages import check_pairing
from tinyctx.middleware.budget import BudgetGuard, ContextPressure
from tinyctx.model import ModelRequest
from tinyctx.ordering import OrderingError
from tinyctx.providers.anthropic import AnthropicModel
from tinyctx.providers.anthropic_context import AnthropicContextEditing
from tinyctx.providers.clearing import (
    CLEARED_PLACEHOLDER,
    ClearToolUses,
    Compaction,
    declare,
    provider_cleared,
)
from tinyctx.testing import capture_events
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

COUNTER = HeuristicCounter()
BIG = "log line with some words " * 200


def tool_history(results: int, *, name: str = "read") -> list[Message]:
    """A task, ``results`` calls each answered by a big result, and a question."""
    history: list[Message] = [UserMessage("task")]
    for i in range(results):
        history.append(AssistantMessage("", (ToolCall(f"c{i}", name, {"i": i}),)))
        history.append(ToolResult(f"c{i}", f"{i} {BIG}", name))
    history.append(UserMessage("so?"))
    return history


class TestClearToolUsesRule:
    """clear_tool_uses_20250919 as documented: trigger, keep, clear_at_least, exclusions."""

    def test_below_the_trigger_nothing_is_cleared(self) -> None:
        """Under ``trigger`` input tokens the edit does not apply."""
        request = ModelRequest(tool_history(4))
        size = COUNTER.count_request(request)
        assert ClearToolUses(trigger=size + 1, keep=0).cleared(request, COUNTER) == 0
        assert ClearToolUses(trigger=size, keep=0).cleared(request, COUNTER) > 0

    def test_all_but_the_newest_keep_results_become_the_placeholder(self) -> None:
        """keep=1 of 4: the three oldest results are cleared, their calls stay."""
        edited, uses, freed = ClearToolUses(trigger=1, keep=1).edit(
            ModelRequest(tool_history(4)), COUNTER
        )
        results = [m for m in edited if isinstance(m, ToolResult)]
        assert [r.content == CLEARED_PLACEHOLDER for r in results] == [True, True, True, False]
        assert uses == 3 and freed > 0
        check_pairing(edited)

    def test_clear_at_least_is_all_or_nothing(self) -> None:
        """When the edit would free fewer than clear_at_least tokens it is not applied."""
        request = ModelRequest(tool_history(2))
        freed = ClearToolUses(trigger=1, keep=1).cleared(request, COUNTER)
        assert ClearToolUses(trigger=1, keep=1, clear_at_least=freed).cleared(request, COUNTER)
        assert (
            ClearToolUses(trigger=1, keep=1, clear_at_least=freed + 1).cleared(request, COUNTER)
            == 0
        )

    def test_excluded_tools_stay_and_inputs_go_when_asked(self) -> None:
        """Results of excluded tools are never cleared; clear_tool_inputs empties the calls'
        arguments of the cleared results."""
        request = ModelRequest(tool_history(3, name="memory"))
        excluded = ClearToolUses(trigger=1, keep=0, exclude_tools=frozenset({"memory"}))
        assert excluded.cleared(request, COUNTER) == 0
        edited, _, _ = ClearToolUses(trigger=1, keep=1, clear_tool_inputs=True).edit(
            request, COUNTER
        )
        calls = [c for m in edited if isinstance(m, AssistantMessage) for c in m.tool_calls]
        assert [dict(c.arguments) for c in calls] == [{}, {}, {"i": 2}]

    @given(histories(), st.integers(min_value=0, max_value=6))
    def test_the_edit_keeps_pairing_and_never_frees_more_than_the_request(
        self, history: tuple[Message, ...], keep: int
    ) -> None:
        """On any history the edited copy is paired as the original, and what it frees is
        between 0 and the request's size."""
        request = ModelRequest(history)
        edited, uses, freed = ClearToolUses(trigger=1, keep=keep).edit(request, COUNTER)
        check_pairing(edited, allow_pending=True)
        assert 0 <= freed <= COUNTER.count_request(request)
        results = sum(isinstance(m, ToolResult) for m in history)
        assert uses <= max(0, results - keep)


class TestCompactionRule:
    """A compaction past its trigger leaves the system messages and a summary."""

    def test_it_frees_the_head_less_the_summary(self) -> None:
        """Past the trigger the whole history but system messages goes for a summary of
        ``summary_tokens``; under it nothing."""
        request = ModelRequest(tool_history(3))
        size = COUNTER.count_messages(request.messages)
        rule = Compaction(trigger=1, summary_tokens=100)
        assert rule.cleared(request, COUNTER) == size - 100
        assert Compaction(trigger=size * 10).cleared(request, COUNTER) == 0

    def test_declared_rules_add_up_to_at_most_the_request(self) -> None:
        """provider_cleared sums the declared rules, capped at the request's count."""
        request = ModelRequest(tool_history(3))
        assert provider_cleared(request, COUNTER) == 0
        twice = declare(declare(request, Compaction(trigger=1, summary_tokens=0)), Compaction(1))
        assert provider_cleared(twice, COUNTER) == COUNTER.count_request(request)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic_client(server) as sdk_client:
        yield sdk_client


class TestGuardLeavesItToTheProvider:
    """The guard compacts only what the provider's declared clearing leaves over its trigger."""

    async def run_guarded(
        self, client: anthropic.AsyncAnthropic, keep_tool_uses: int
    ) -> tuple[list[object], int]:
        """One call over a history of six big results, the guard's trigger under its size;
        returns the guard's pressure events and the tool results the request carried."""
        history = tool_history(6)
        size = COUNTER.count_request(ModelRequest(history))
        guard = BudgetGuard(
            max_tokens=int(size * 1.2),
            reserved_output_tokens=0,
            trigger=0.7,
            counter=COUNTER,
            calibrate=False,
        )
        editing = AnthropicContextEditing(trigger_tokens=size // 2, keep_tool_uses=keep_tool_uses)
        agent = Agent(
            AnthropicModel("claude-sonnet-4-6", client=client), middleware=[editing, guard]
        )
        with capture_events(ContextPressure) as pressure:
            async with Session(agent) as session:
                await session.run(history)
                sent = session.conversation_messages
        return list(pressure), sum(isinstance(m, ToolResult) and BIG in m.text for m in sent)

    async def test_the_guard_does_not_compact_what_the_provider_will_clear(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """The provider keeps 1 of 6 results: what is left is under the guard's trigger, so
        the guard does nothing and the thread keeps every result."""
        server.add(json_reply(anthropic_message([{"type": "text", "text": "ok"}])))
        pressure, kept = await self.run_guarded(client, keep_tool_uses=1)
        assert pressure == []
        assert kept == 6
        assert server.requests[0].json()["context_management"]["edits"][0]["keep"]["value"] == 1

    async def test_the_guard_compacts_when_the_provider_will_not_clear_enough(
        self, server: LoopbackServer, client: anthropic.AsyncAnthropic
    ) -> None:
        """The provider keeps all 6 results: the guard acts as it would alone."""
        server.add(json_reply(anthropic_message([{"type": "text", "text": "ok"}])))
        pressure, kept = await self.run_guarded(client, keep_tool_uses=6)
        assert len(pressure) == 1
        assert kept < 6

    def test_a_provider_layer_inside_the_guard_is_refused(self) -> None:
        """Inside the guard the rule would come too late: the agent refuses the order."""
        with pytest.raises(OrderingError, match="AnthropicContextEditing"):
            Agent(
                AnthropicModel("claude-sonnet-4-6", api_key="k"),
                middleware=[BudgetGuard(max_tokens=1000), AnthropicContextEditing()],
            )
