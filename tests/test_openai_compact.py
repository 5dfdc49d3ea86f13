"""ResponsesCompact: OpenAI's server-side compaction as a layer, against a loopback server
and the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from tests.loopback import TRIO_ASYNCGEN_WARNING, LoopbackServer, json_reply, openai_client
from tests.loopback_wire import message_item, responses_body
from tinyctx import Agent, AssistantMessage, ConfigError, MemoryStore, Session, UserMessage
from tinyctx.codec import decode_messages
from tinyctx.messages import check_pairing
from tinyctx.providers.openai_compact import ProviderCompacted, ResponsesCompact
from tinyctx.providers.openai_responses import OpenAIResponsesModel
from tinyctx.testing import capture_events
from tinyctx.tokens import HeuristicCounter

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

COMPACTION = {"id": "cmp_1", "type": "compaction", "encrypted_content": "ENCRYPTED-SUMMARY"}


def compacted(*user_texts: str, output_tokens: int = 120) -> dict[str, Any]:
    users = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}
        for t in user_texts
    ]
    return {
        "id": "cmpr_1",
        "object": "response.compaction",
        "created_at": 1_700_000_000,
        "output": [*users, COMPACTION],
        "usage": {
            "input_tokens": 900,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 900 + output_tokens,
        },
    }


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == []


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(server) as sdk_client:
        yield sdk_client


class TestResponsesCompact:
    """Past its trigger, the head of the thread is compacted by the provider."""

    async def test_the_head_is_replaced_by_the_compaction_and_sent_verbatim(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """The compact call gets the head; the thread keeps the user messages and the
        compaction item, which the next request sends back as it came; the store has it."""
        long = "context " * 300
        server.add(
            json_reply(responses_body([message_item("first answer " + long)])),
            json_reply(compacted("q1")),
            json_reply(responses_body([message_item("second answer")])),
            json_reply(responses_body([message_item("third answer")])),
        )
        model = OpenAIResponsesModel("gpt-5", client=client)
        layer = ResponsesCompact(model, trigger_tokens=800, keep_recent=1)
        store = MemoryStore()
        agent = Agent(model, middleware=[layer], system_prompt="Be brief.")
        with capture_events(ProviderCompacted) as events:
            async with Session(agent, thread_id="c", store=store) as session:
                await session.run("q1")
                await session.run("q2")
                await session.run("q3")
                history = session.conversation_messages
        paths = [r.path for r in server.requests]
        assert paths == ["/v1/responses", "/v1/responses/compact", "/v1/responses", "/v1/responses"]
        sent = server.requests[1].json()
        assert sent["instructions"] == "Be brief."
        assert [i.get("role") for i in sent["input"]] == ["user", "assistant"]
        second = server.requests[2].json()["input"]
        assert second == [
            {"type": "message", "role": "user", "content": "q1"},
            COMPACTION,
            {"type": "message", "role": "user", "content": "q2"},
        ]
        assert server.requests[3].json()["input"][1] == COMPACTION
        (event,) = events
        assert isinstance(event, ProviderCompacted)
        assert (event.messages_before, event.messages_after, event.persisted) == (2, 2, True)
        assert event.freed_tokens > 0
        check_pairing(history)
        assert isinstance(history[1], AssistantMessage) and history[1].content == ""
        assert HeuristicCounter().count_message(history[1]) >= 120
        stored = await store.load_thread("c")
        assert decode_messages(stored.messages) == history

    async def test_under_the_trigger_nothing_is_compacted(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """A short thread goes to the model as it is: no compact call."""
        server.add(json_reply(responses_body([message_item("ok")])))
        model = OpenAIResponsesModel("gpt-5", client=client)
        agent = Agent(model, middleware=[ResponsesCompact(model, trigger_tokens=10_000)])
        async with Session(agent) as session:
            await session.run("hi")
            assert session.conversation_messages[0] == UserMessage("hi")
        assert [r.path for r in server.requests] == ["/v1/responses"]

    async def test_bad_settings_name_the_field(self, client: openai.AsyncOpenAI) -> None:
        """A wrong model or a trigger below 1 is a ConfigError naming it."""
        model = OpenAIResponsesModel("gpt-5", client=client)
        with pytest.raises(ConfigError, match="trigger_tokens"):
            ResponsesCompact(model, trigger_tokens=0)
        with pytest.raises(ConfigError, match="model"):
            ResponsesCompact("gpt-5", trigger_tokens=10)  # type: ignore[arg-type]


class TestWithTheBudgetGuard:
    """Outside the guard, the provider's compaction is done before the guard measures."""

    async def test_the_guard_does_not_act_on_what_the_provider_compacted(
        self, server: LoopbackServer, client: openai.AsyncOpenAI
    ) -> None:
        """The thread passes the guard's trigger, the provider compacts it under: the
        guard sees the compacted request and does nothing."""
        from tinyctx.middleware.budget import BudgetGuard, ContextPressure

        counter = HeuristicCounter()
        server.add(
            json_reply(responses_body([message_item("first answer " + "context " * 300)])),
            json_reply(compacted("q1")),
            json_reply(responses_body([message_item("second answer")])),
        )
        model = OpenAIResponsesModel("gpt-5", client=client)
        guard = BudgetGuard(
            max_tokens=1000, reserved_output_tokens=0, trigger=0.7, counter=counter, calibrate=False
        )
        layer = ResponsesCompact(model, trigger_tokens=700, keep_recent=1, counter=counter)
        agent = Agent(model, middleware=[layer, guard])
        with capture_events(ContextPressure) as pressure, capture_events(ProviderCompacted) as done:
            async with Session(agent) as session:
                await session.run("q1")
                await session.run("q2")
        assert len(done) == 1 and pressure == []

    async def test_inside_the_guard_it_is_refused(self, client: openai.AsyncOpenAI) -> None:
        """Inside the guard the guard would act first: the agent refuses the order."""
        from tinyctx.middleware.budget import BudgetGuard
        from tinyctx.ordering import OrderingError

        model = OpenAIResponsesModel("gpt-5", client=client)
        with pytest.raises(OrderingError, match="ResponsesCompact"):
            Agent(
                model,
                middleware=[
                    BudgetGuard(max_tokens=1000),
                    ResponsesCompact(model, trigger_tokens=9),
                ],
            )
