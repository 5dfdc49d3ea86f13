"""Model adapters for real provider APIs, over their official SDKs.

- :class:`tinyctx.providers.openai.OpenAIChatModel` (``pip install 'tinyctx[openai]'``)
- :class:`tinyctx.providers.anthropic.AnthropicModel` (``pip install 'tinyctx[anthropic]'``)

Importing this package needs neither SDK; each adapter imports its SDK when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .openai import OpenAIChatModel

__all__ = ["OpenAIChatModel", "AnthropicModel"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from .openai import OpenAIChatModel

        return OpenAIChatModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module 'tinyctx.providers' has no attribute {name!r}")
