"""tinyctx layers inside other agent frameworks.

- :mod:`tinyctx.integrations.langchain`: an ``AgentMiddleware`` for LangChain's
  ``create_agent`` (extra ``tinyctx[langchain]``)
- :mod:`tinyctx.integrations.openai_agents`: a ``call_model_input_filter`` and a
  ``Session`` on tinyctx's thread stores for the OpenAI Agents SDK
  (extra ``tinyctx[openai-agents]``)
- :mod:`tinyctx.integrations.pydantic_ai`: a history processor for pydantic-ai
  (extra ``tinyctx[pydantic-ai]``)

Each adapter runs a :class:`Stack` (any tinyctx layers, composed once) around the
framework's own model call, with lossless message conversion both ways;
:func:`read_thread` and :func:`write_thread` read and write a whole tinyctx thread (the
import/export helpers of each adapter use them). Importing this package imports no
framework; each submodule imports only its own.
"""

from __future__ import annotations

from ._stack import FrameworkModel, FrameworkTool, Stack, StackCall, StackInterrupted
from ._threads import read_thread, write_thread

__all__ = [
    "Stack",
    "StackCall",
    "StackInterrupted",
    "FrameworkModel",
    "FrameworkTool",
    "read_thread",
    "write_thread",
]
