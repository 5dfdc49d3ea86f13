"""The kernel refuses a model request no model can take, naming the layer that made it."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import Agent, AssistantMessage, ModelRequest, ModelResponse, RunContext, Session
from tinyctx.request_rules import InvalidModelRequest, supports_prefill
from tinyctx.testing import ScriptedModel


class _NoPrefill(ScriptedModel):
    """A scripted model that, like the OpenAI adapters, cannot continue an assistant turn."""

    supports_prefill = False


async def keep(request: ModelRequest, ctx: RunContext[Any], call_next: Any) -> ModelResponse:
    """A layer that passes the request on unchanged."""
    response: ModelResponse = await call_next(request, ctx)
    return response


async def empty_it(request: ModelRequest, ctx: RunContext[Any], call_next: Any) -> ModelResponse:
    """A layer that drops every message."""
    response: ModelResponse = await call_next(request.evolve(messages=()), ctx)
    return response


async def prefill(request: ModelRequest, ctx: RunContext[Any], call_next: Any) -> ModelResponse:
    """A layer that ends the request with an assistant message to continue."""
    messages = (*request.messages, AssistantMessage("Sure, here is"))
    response: ModelResponse = await call_next(request.evolve(messages=messages), ctx)
    return response


class TestRefusedAtTheKernel:
    """An emptied request, or a prefill the model cannot take, never reaches the model."""

    async def test_an_emptied_request_names_the_layer(self) -> None:
        """The layer that emptied it is named, even with unchanged layers around it."""
        model = ScriptedModel(["never"])
        agent = Agent(model=model, middleware=[keep, empty_it, _Keep()])
        async with Session(agent) as session:
            with pytest.raises(InvalidModelRequest) as info:
                await session.run("hi")
        assert info.value.layer == "empty_it"
        assert info.value.problem == "empty"
        assert "empty_it" in str(info.value)
        assert model.calls == 0

    async def test_a_prefill_is_refused_without_support(self) -> None:
        """Ending in an assistant message is refused for a model without prefill."""
        model = _NoPrefill(["never"])
        agent = Agent(model=model, middleware=[prefill, _Keep()])
        async with Session(agent) as session:
            with pytest.raises(InvalidModelRequest) as info:
                await session.run("hi")
        assert (info.value.layer, info.value.problem) == ("prefill", "ends_with_assistant")
        assert "prefill" in str(info.value)
        assert model.calls == 0

    async def test_a_prefill_reaches_a_model_that_supports_it(self) -> None:
        """A model that continues assistant turns gets the prefilled request."""
        model = ScriptedModel(["a poem"])
        assert supports_prefill(model)
        agent = Agent(model=model, middleware=[prefill])
        async with Session(agent) as session:
            result = await session.run("hi")
        assert result.final_text == "a poem"
        assert model.requests[0].messages[-1] == AssistantMessage("Sure, here is")

    async def test_the_loops_own_request_is_not_a_layers_fault(self) -> None:
        """run(None) after an answer: the loop's request ends with the answer; layers that
        pass it on unchanged are not blamed."""
        model = _NoPrefill(["first", "second"])
        agent = Agent(model=model, middleware=[keep, _Keep()])
        async with Session(agent) as session:
            await session.run("hi")
            result = await session.run(None)
        assert result.final_text == "second"

    async def test_check_requests_false_sends_anything(self) -> None:
        """Agent(check_requests=False) turns the check off (replay measures raw stacks)."""
        model = ScriptedModel(["ok"])
        agent = Agent(model=model, middleware=[empty_it], check_requests=False)
        async with Session(agent) as session:
            assert (await session.run("hi")).final_text == "ok"
        assert model.requests[0].messages == ()


class _Keep:
    """A Layer-like callable passing requests on (a second unchanged layer)."""

    name = "keep_last"

    async def __call__(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: Any
    ) -> ModelResponse:
        response: ModelResponse = await call_next(request, ctx)
        return response
