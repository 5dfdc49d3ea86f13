"""The pytest plugin: its fixtures on trio and asyncio, and loading it stays light."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import Agent, RunContext, Session, UserMessage
from tinyctx.events import ModelStreamDelta
from tinyctx.testing import ScriptedModel, reply, run_layer, stream

pytest_plugins = ["pytester"]


class TestFixtures:
    """tinyctx_ctx, scripted_model and captured_events serve async tests on both backends."""

    async def test_fixtures_drive_a_layer(
        self,
        anyio_backend: str,
        tinyctx_ctx: RunContext[Any],
        scripted_model: ScriptedModel,
        captured_events: list[Any],
    ) -> None:
        scripted_model.add(stream("on ", anyio_backend))
        response = await run_layer(
            lambda request, ctx, call_next: call_next(request, ctx),
            [UserMessage("hi")],
            tinyctx_ctx,
            next=scripted_model,
        )
        assert response.text == f"on {anyio_backend}"
        assert scripted_model.contexts == [tinyctx_ctx]
        assert [e.text for e in captured_events if isinstance(e, ModelStreamDelta)] == [
            "on ",
            anyio_backend,
        ]
        assert all(e.run_id == tinyctx_ctx.run_id for e in captured_events)

    async def test_fixtures_serve_a_session(
        self, scripted_model: ScriptedModel, captured_events: list[Any]
    ) -> None:
        scripted_model.add(reply("done", usage=(3, 1)))
        async with Session(Agent(model=scripted_model)) as session:
            result = await session.run("go")
        assert result.final_text == "done"
        assert [e.kind for e in captured_events][0] == "run.started"

    def test_each_test_gets_fresh_fixtures(
        self, tinyctx_ctx: RunContext[Any], scripted_model: ScriptedModel
    ) -> None:
        assert tinyctx_ctx.conversation.messages == ()
        assert scripted_model.calls == 0 and scripted_model.remaining == 0


LIGHT_CHECK = """
import sys

import structlog


def test_loading_the_plugin_stayed_light():
    heavy = [m for m in sys.modules if m.split(".")[0] == "hypothesis"]
    heavy += [m for m in sys.modules if m.split(".")[0] == "tinyctx"]
    assert heavy == []
    assert "_tinyctx_pytest" in sys.modules
    assert not structlog.is_configured()


def test_fixtures_come_from_the_entry_point(request, tinyctx_ctx, scripted_model, captured_events):
    plugin = request.config.pluginmanager.get_plugin("tinyctx")
    assert plugin is not None and plugin.__name__ == "_tinyctx_pytest"
    assert type(scripted_model).__name__ == "ScriptedModel"
    assert captured_events == []
    assert "hypothesis" not in sys.modules
"""


class TestPluginLoading:
    """pytest loads the plugin from its entry point without hypothesis or logging setup."""

    def test_plugin_is_registered_and_import_light(self, pytester: pytest.Pytester) -> None:
        pytester.makepyfile(test_light=LIGHT_CHECK)
        # a fresh interpreter: nothing imported by this test session can leak in
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
        result.assert_outcomes(passed=2)
