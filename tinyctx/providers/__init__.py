"""Model adapters for real provider APIs, over their official SDKs.

- :class:`tinyctx.providers.openai.OpenAIChatModel` (``pip install 'tinyctx[openai]'``)
- :class:`tinyctx.providers.openai_responses.OpenAIResponsesModel` (the Responses API,
  ``pip install 'tinyctx[openai]'``), and :class:`tinyctx.providers.openai_compact.
  ResponsesCompact`, a layer that has OpenAI compact the thread (``responses.compact``)
- :class:`tinyctx.providers.anthropic.AnthropicModel` (``pip install 'tinyctx[anthropic]'``),
  and :class:`tinyctx.providers.anthropic_context.AnthropicContextEditing` and
  :class:`tinyctx.providers.anthropic_compaction.AnthropicCompaction`, layers that turn on
  Anthropic's server-side clearing of old tool results and compaction
- :mod:`tinyctx.providers.clearing`: the providers' documented rules, which those layers
  declare to the budget guard, and :mod:`tinyctx.providers.estimates`, the same rules
  applied locally for ``tinyctx replay --stack anthropic-estimate``
- :class:`tinyctx.providers.gemini.GeminiModel` (``pip install 'tinyctx[gemini]'``)

Importing this package needs neither SDK; each adapter imports its SDK when first used.

Both SDKs run their HTTP on httpx2 over anyio, so the adapters work under trio and asyncio
alike (the tests run every adapter test on both). One difference under trio: a stream the
SDK leaves unfinished (any cancelled stream; the OpenAI SDK also stops reading at
``[DONE]``) leaves the SDK's and httpx's async generators for trio to finalize, and trio
reports each with a ``ResourceWarning`` ("Async generator ... was garbage collected before
it had been exhausted"). The HTTP response itself is closed; the warning is harmless and
Python hides ResourceWarning by default. A test suite that turns warnings into errors can
ignore it for the ``openai``, ``anthropic``, ``httpx2`` and ``httpcore2`` generators.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .gemini import GeminiModel
    from .openai import OpenAIChatModel
    from .openai_responses import OpenAIResponsesModel

__all__ = ["OpenAIChatModel", "OpenAIResponsesModel", "AnthropicModel", "GeminiModel"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from .openai import OpenAIChatModel

        return OpenAIChatModel
    if name == "OpenAIResponsesModel":
        from .openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    if name == "GeminiModel":
        from .gemini import GeminiModel

        return GeminiModel
    raise AttributeError(f"module 'tinyctx.providers' has no attribute {name!r}")
