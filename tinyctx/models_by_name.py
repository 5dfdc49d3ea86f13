"""A model by name: ``Agent(model="openai:gpt-4o")``.

A name is ``"<prefix>:<model>"``. The built-in prefixes are the adapters of
:mod:`tinyctx.providers`, each behind its extra:

=====================  ==========================================  =========================
prefix                 adapter                                     install
=====================  ==========================================  =========================
``openai``             :class:`~tinyctx.providers.OpenAIChatModel`   ``tinyctx[openai]``
``openai-responses``   :class:`~tinyctx.providers.OpenAIResponsesModel` ``tinyctx[openai]``
``anthropic``          :class:`~tinyctx.providers.AnthropicModel`    ``tinyctx[anthropic]``
``gemini``             :class:`~tinyctx.providers.GeminiModel`       ``tinyctx[gemini]``
=====================  ==========================================  =========================

An application adds its own prefixes with :func:`register_model_prefix`, or declares them
in the ``tinyctx.models`` entry-point group (as layers are declared in ``tinyctx.layers``)::

    [project.entry-points."tinyctx.models"]
    myco = "myco.llm:model_for"   # model_for("big-1", **options) -> a model handler

A factory is called with the model part of the name and the options given to
:func:`resolve_model`, and returns a model handler. Building a model contacts nothing: the
OpenAI and Anthropic clients read their API key when the first request goes out (OpenAI's
through a key function that reads ``OPENAI_API_KEY`` then), so an agent can be built
before the key is set. Gemini's SDK wants its key when the client is built.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import weakref
from importlib import metadata
from typing import Any, Final, Protocol

from .errors import ConfigError
from .model import ModelHandler

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelFactory",
    "ModelExtraMissing",
    "model_prefixes",
    "register_model_prefix",
    "unregister_model_prefix",
    "resolve_model",
    "name_of",
]

ENTRY_POINT_GROUP: Final = "tinyctx.models"
_PREFIX: Final = re.compile(r"[a-z][a-z0-9_.-]*")
_PREFIX_RULE: Final = "lowercase letters, digits, '_', '.' or '-', starting with a letter"

# prefix -> (module, class, extra)
_BUILT_IN: Final[dict[str, tuple[str, str, str]]] = {
    "openai": ("tinyctx.providers.openai", "OpenAIChatModel", "openai"),
    "openai-responses": ("tinyctx.providers.openai_responses", "OpenAIResponsesModel", "openai"),
    "anthropic": ("tinyctx.providers.anthropic", "AnthropicModel", "anthropic"),
    "gemini": ("tinyctx.providers.gemini", "GeminiModel", "gemini"),
}


class ModelFactory(Protocol):
    """Builds the model handler for the model part of a name: ``factory("gpt-4o")``."""

    def __call__(self, model: str, /, **options: Any) -> ModelHandler: ...


class ModelExtraMissing(ConfigError):
    """A model by name whose provider SDK is not installed; the message names the extra."""

    def __init__(self, name: str, extra: str, error: ImportError) -> None:
        super().__init__(
            "model",
            name,
            f"a model whose provider SDK is installed: {name!r} needs "
            f"pip install 'tinyctx[{extra}]' ({error})",
            owner="Agent",
        )
        self.extra = extra


_registered: dict[str, ModelFactory] = {}
# model handlers built from a name -> the model part, for Agent.model_name
_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ConfigError("prefix", prefix, _PREFIX_RULE, owner="register_model_prefix")
    return prefix


def register_model_prefix(prefix: str, factory: ModelFactory, *, replace: bool = False) -> None:
    """Resolve ``"<prefix>:<model>"`` names with ``factory``, in this process.

    A prefix already known (built in, from an entry point, or registered) is refused
    unless ``replace=True``; a registered prefix wins over an entry point and a built-in.
    """
    _check_prefix(prefix)
    if not callable(factory):
        raise ConfigError(
            "factory",
            factory,
            "a callable (model, **options) -> model handler",
            owner="register_model_prefix",
        )
    if not replace and prefix in model_prefixes():
        raise ConfigError(
            "prefix",
            prefix,
            "a prefix not in use (pass replace=True to take it over)",
            owner="register_model_prefix",
        )
    _registered[prefix] = factory


def unregister_model_prefix(prefix: str) -> bool:
    """Forget a prefix :func:`register_model_prefix` added; False when there was none."""
    return _registered.pop(prefix, None) is not None


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def model_prefixes() -> list[str]:
    """Every prefix a name may use: built in, from entry points, registered."""
    return sorted({*_BUILT_IN, *_entry_points(), *_registered})


def _split(name: str) -> tuple[str, str]:
    prefix, colon, model = name.partition(":")
    if not colon or not prefix or not model:
        raise ConfigError(
            "model",
            name,
            "a model handler, or a name '<prefix>:<model>' with a prefix of "
            f"{', '.join(model_prefixes())} (e.g. 'openai:gpt-4o')",
            owner="Agent",
        )
    return prefix, model


def _factory(prefix: str, name: str) -> ModelFactory:
    if prefix in _registered:
        return _registered[prefix]
    entry = _entry_points().get(prefix)
    if entry is not None:
        loaded = entry.load()
        if not callable(loaded):
            raise ConfigError(
                "model", name, f"entry point {entry.value!r} to be callable", owner="Agent"
            )
        factory: ModelFactory = loaded
        return factory
    built_in = _BUILT_IN.get(prefix)
    if built_in is None:
        raise ConfigError(
            "model",
            name,
            f"a name whose prefix is one of {', '.join(model_prefixes())}; "
            f"{prefix!r} is not (register it with tinyctx.models_by_name.register_model_prefix "
            f"or the {ENTRY_POINT_GROUP!r} entry-point group)",
            owner="Agent",
        )
    module_name, class_name, extra = built_in
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelExtraMissing(name, extra, exc) from exc
    adapter: Any = getattr(module, class_name)
    if prefix in ("openai", "openai-responses"):
        return functools.partial(_openai_model, adapter)
    built: ModelFactory = adapter
    return built


async def _openai_key() -> str:
    """The OpenAI key, read when a request goes out."""
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        import openai

        raise openai.OpenAIError(
            "no OpenAI API key: set OPENAI_API_KEY, or build the model with api_key=..."
        )
    return key


def _openai_model(adapter: Any, model: str, /, **options: Any) -> ModelHandler:
    """An OpenAI adapter whose client reads its key at the first request when none is
    configured yet (the SDK refuses to build a client without one)."""
    unset = options.get("client") is None and options.get("api_key") is None
    if unset and not os.environ.get("OPENAI_API_KEY"):
        import openai

        base_url = options.pop("base_url", None)
        client = openai.AsyncOpenAI(api_key=_openai_key, base_url=base_url)
        handler = adapter(model, client=client, **options)
        handler._owns_client = True  # built here for it: its aclose() closes it
        return handler  # type: ignore[no-any-return]
    return adapter(model, **options)  # type: ignore[no-any-return]


def resolve_model(name: str, **options: Any) -> ModelHandler:
    """The model handler for ``"<prefix>:<model>"``; ``options`` go to its factory
    (``resolve_model("openai:gpt-4o", stream=True, temperature=0)``).

    An unknown prefix is a ConfigError naming the known ones; a built-in provider whose SDK
    is missing is a :class:`ModelExtraMissing` naming the extra to install.
    """
    if not isinstance(name, str):
        raise ConfigError("model", name, "a '<prefix>:<model>' string", owner="Agent")
    prefix, model = _split(name)
    handler = _factory(prefix, name)(model, **options)
    if not callable(handler):
        raise ConfigError(
            "model",
            name,
            f"a factory for {prefix!r} that returns a model handler, got {type(handler).__name__}",
            owner="Agent",
        )
    with contextlib.suppress(TypeError):  # not weakly referenceable: no model_name
        _names[handler] = model
    return handler


def name_of(handler: object) -> str | None:
    """The model part of the name ``handler`` was resolved from, else None."""
    try:
        return _names.get(handler)
    except TypeError:
        return None
