"""A model by name (``Agent(model="openai:gpt-4o")``) and Agent.run_sync."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest

from tests.loopback import LoopbackServer, json_reply, openai_completion
from tinyctx import Agent, ConfigError, ProviderError, Session
from tinyctx import models_by_name as by_name
from tinyctx.models_by_name import (
    ModelExtraMissing,
    model_prefixes,
    register_model_prefix,
    resolve_model,
    unregister_model_prefix,
)
from tinyctx.providers import AnthropicModel, GeminiModel, OpenAIChatModel, OpenAIResponsesModel
from tinyctx.testing import EchoModel, ScriptedModel

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)


class TestBuiltInPrefixes:
    """The provider adapters by name, built without a key and without contacting anything."""

    @pytest.mark.usefixtures("no_keys")
    async def test_openai_without_a_key_contacts_nothing(
        self, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Built with no key, sent nothing; the key is read when the first request goes."""
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        agent = Agent(model="openai:gpt-4o")
        assert isinstance(agent.model, OpenAIChatModel)
        assert agent.model_name == "gpt-4o"
        assert server.requests == []
        with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
            await agent.run("hi")
        assert server.requests == []
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        server.add(json_reply(openai_completion("hello")))
        async with Session(agent) as session:
            assert (await session.run("hi")).final_text == "hello"
        assert server.requests[0].headers["authorization"] == "Bearer test-key"
        await agent.model.aclose()  # type: ignore[attr-defined]

    @pytest.mark.usefixtures("no_keys")
    def test_anthropic_and_responses_without_a_key(
        self, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Anthropic and the Responses API build without a key and send nothing."""
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        claude = Agent(model="anthropic:claude-sonnet-4-5")
        responses = Agent(model="openai-responses:gpt-5")
        assert isinstance(claude.model, AnthropicModel)
        assert claude.model.model == "claude-sonnet-4-5"
        assert isinstance(responses.model, OpenAIResponsesModel)
        assert (claude.model_name, responses.model_name) == ("claude-sonnet-4-5", "gpt-5")
        assert server.requests == []

    @pytest.mark.usefixtures("no_keys")
    def test_gemini_wants_its_key_when_built(
        self, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Gemini's SDK needs its key up front: without one the error names it."""
        with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
            Agent(model="gemini:gemini-2.5-flash")
        monkeypatch.setenv("GEMINI_API_KEY", "test-key")
        model = resolve_model("gemini:gemini-2.5-flash", base_url=server.url)
        assert isinstance(model, GeminiModel)
        assert server.requests == []

    def test_evolving_the_model_changes_its_name(self) -> None:
        """A model by name replaced by evolve() takes its name along; a set one stays."""
        first = Agent(model=resolve_model("openai:gpt-4o", api_key="k"))
        assert first.model_name == "gpt-4o"
        second = first.evolve(model=resolve_model("anthropic:claude-sonnet-4-5", api_key="k"))
        assert second.model_name == "claude-sonnet-4-5"
        plain = first.evolve(model=EchoModel())
        assert plain.model_name is None
        pinned = Agent(EchoModel(), model_name="mine").evolve(model=EchoModel())
        assert pinned.model_name == "mine"

    def test_options_reach_the_adapter(self) -> None:
        """resolve_model passes its options to the adapter (checked as the adapter does)."""
        model = resolve_model("openai:gpt-4o", api_key="k", stream=True, temperature=0)
        assert isinstance(model, OpenAIChatModel)
        assert (model.stream, model.settings) == (True, {"temperature": 0})
        with pytest.raises(ConfigError, match="temperatur"):
            resolve_model("openai:gpt-4o", api_key="k", temperatur=0)

    def test_a_missing_extra_is_named(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A provider whose SDK cannot be imported: the error names the extra to install."""
        monkeypatch.setitem(sys.modules, "tinyctx.providers.anthropic", None)
        with pytest.raises(ModelExtraMissing, match=r"pip install 'tinyctx\[anthropic\]'"):
            Agent(model="anthropic:claude-sonnet-4-5")

    @pytest.mark.parametrize("name", ["gpt-4o", "openai:", ":gpt-4o", "nope:model"])
    def test_a_bad_name_lists_the_prefixes(self, name: str) -> None:
        """A name without a known prefix is a ConfigError naming the prefixes there are."""
        with pytest.raises(ConfigError, match="anthropic, gemini, openai, openai-responses"):
            Agent(model=name)


class TestAppPrefixes:
    """Applications add prefixes in code or through the tinyctx.models entry points."""

    def test_register_and_unregister(self) -> None:
        """A registered prefix resolves; a taken one is refused unless replace=True."""
        register_model_prefix("acme", lambda model, **options: EchoModel(f"{model}: "))
        try:
            agent = Agent(model="acme:big-1")
            assert isinstance(agent.model, EchoModel)
            assert agent.model_name == "big-1"
            assert agent.run_sync("hi").final_text == "big-1: hi"
            with pytest.raises(ConfigError, match="not in use"):
                register_model_prefix("acme", lambda model, **options: EchoModel())
            with pytest.raises(ConfigError, match="not in use"):
                register_model_prefix("openai", lambda model, **options: EchoModel())
            register_model_prefix("acme", lambda model, **options: EchoModel(), replace=True)
            assert "acme" in model_prefixes()
        finally:
            assert unregister_model_prefix("acme")
        assert "acme" not in model_prefixes()
        assert not unregister_model_prefix("acme")

    def test_bad_registrations(self) -> None:
        """A prefix must be a lowercase word, a factory callable and return a handler."""
        with pytest.raises(ConfigError, match="lowercase"):
            register_model_prefix("Acme", lambda model, **options: EchoModel())
        with pytest.raises(ConfigError, match="factory"):
            register_model_prefix("acme", "EchoModel")  # type: ignore[arg-type]
        register_model_prefix("broken", lambda model, **options: 42)  # type: ignore[arg-type,return-value]
        try:
            with pytest.raises(ConfigError, match="returns a model handler, got int"):
                Agent(model="broken:x")
        finally:
            unregister_model_prefix("broken")

    def test_an_entry_point_prefix(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A prefix declared in the tinyctx.models group resolves through its factory."""
        entry = metadata.EntryPoint(
            name="echo", value="tinyctx.testing:EchoModel", group=by_name.ENTRY_POINT_GROUP
        )
        monkeypatch.setattr(by_name, "_entry_points", lambda: {"echo": entry})
        agent = Agent(model="echo:> ")
        assert agent.run_sync("hi").final_text == "> hi"
        assert "echo" in model_prefixes()


class TestRunSync:
    """Agent.run_sync runs a script's run in its own loop, and refuses inside a loop."""

    @pytest.mark.parametrize("backend", ["trio", "asyncio"])
    def test_runs_and_returns_the_result(self, backend: Any) -> None:
        """A run with no event loop around: the result, on either backend."""
        result = Agent(ScriptedModel(["done"])).run_sync("go", backend=backend)
        assert result.final_text == "done"

    def test_session_options_are_passed(self) -> None:
        """Session options (thread_id) reach the session."""
        result = Agent(ScriptedModel(["done"])).run_sync("go", thread_id="t1")
        assert result.thread_id == "t1"

    async def test_inside_a_running_loop_it_says_to_await(self) -> None:
        """Called inside a running loop it raises at once, naming ``await agent.run``."""
        agent = Agent(ScriptedModel(["never"]))
        with pytest.raises(RuntimeError, match=r"running .* event loop.*await agent.run"):
            agent.run_sync("go")
        assert agent.model.calls == 0  # type: ignore[attr-defined]

    def test_a_bad_backend(self) -> None:
        """An unknown backend is a ConfigError naming the allowed ones."""
        with pytest.raises(ConfigError, match="'trio' or 'asyncio'"):
            Agent(ScriptedModel(["x"])).run_sync("go", backend="curio")  # type: ignore[arg-type]
