"""tinyctx: manage what an LLM agent knows at run time.

An onion of middleware layers around one core ``call_model`` handler. The kernel (this
package) knows no concrete layer; the layer library is ``tinyctx.middleware``.

The root holds what a user of the README needs: the agent and its session, tools, the
``Layer`` base with its request and response, the messages, the control outcomes and
review decisions, the everyday stores, events and the errors a caller catches. Everything
else is imported from the module that defines it: ``tinyctx.events`` (every event class),
``tinyctx.stores`` and ``tinyctx.threads`` (store protocols and durable threads),
``tinyctx.codec``, ``tinyctx.chain``/``tinyctx.ordering``/``tinyctx.state`` (for layer
authors), ``tinyctx.messages`` (pairing helpers), ``tinyctx.tokens`` and ``tinyctx.testing``.

The root names load on first use (PEP 562): ``import tinyctx`` alone, as a pytest plugin or
a hypothesis hook does, costs a process almost nothing; ``from tinyctx import Agent`` loads
what an agent needs."""

from __future__ import annotations

import importlib
import sys as _sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent import (
        Agent,
        RunResult,
        RunStatus,
        Session,
    )
    from .cancel import (
        CancellationToken,
    )
    from .chain import (
        Layer,
        ModelCall,
        after_model,
        before_model,
        tool_layer,
    )
    from .context import (
        RunConfig,
        RunContext,
    )
    from .control import (
        Interrupt,
        StopWithFinal,
        Suspend,
    )
    from .decisions import (
        Approve,
        Edit,
        Reject,
        Respond,
    )
    from .errors import (
        ConfigError,
        ContextLimitExceeded,
        DepthLimitExceeded,
        Interrupted,
        InvalidCheckpoint,
        LimitExceeded,
        PairingError,
        ProviderError,
        ResumeError,
        RetryableProviderError,
        RunCancelled,
        SessionBusy,
        TinyCtxError,
        ToolError,
    )
    from .events import (
        Event,
        EventSink,
    )
    from .messages import (
        AssistantMessage,
        Message,
        SystemMessage,
        ToolCall,
        ToolResult,
        UserMessage,
    )
    from .model import (
        ModelRequest,
        ModelResponse,
        Usage,
    )
    from .parts import (
        DocumentPart,
        ImagePart,
        TextPart,
    )
    from .stores import (
        MemoryStore,
        SqliteStore,
        StoreError,
    )
    from .tools import (
        Tool,
        tool,
    )

__version__ = "0.1.0.dev0"
__all__ = [
    # running an agent
    "Agent",
    "Session",
    "RunResult",
    "RunStatus",
    "RunConfig",
    "CancellationToken",
    # tools
    "tool",
    "Tool",
    # writing a layer
    "Layer",
    "RunContext",
    "ModelRequest",
    "ModelResponse",
    "ModelCall",
    "Usage",
    "before_model",
    "after_model",
    "tool_layer",
    # messages and their parts
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolCall",
    "ToolResult",
    "TextPart",
    "ImagePart",
    "DocumentPart",
    # control outcomes and review decisions
    "Interrupt",
    "StopWithFinal",
    "Suspend",
    "Approve",
    "Edit",
    "Reject",
    "Respond",
    # stores for everyday use
    "MemoryStore",
    "SqliteStore",
    # events
    "Event",
    "EventSink",
    # the errors a caller catches
    "TinyCtxError",
    "ConfigError",
    "PairingError",
    "RunCancelled",
    "Interrupted",
    "ContextLimitExceeded",
    "LimitExceeded",
    "DepthLimitExceeded",
    "SessionBusy",
    "ResumeError",
    "ToolError",
    "ProviderError",
    "RetryableProviderError",
    "InvalidCheckpoint",
    "StoreError",
]

# each root name and the module that defines it
_HOME: dict[str, str] = {
    "Agent": "agent",
    "Session": "agent",
    "RunResult": "agent",
    "RunStatus": "agent",
    "RunConfig": "context",
    "CancellationToken": "cancel",
    "tool": "tools",
    "Tool": "tools",
    "Layer": "chain",
    "RunContext": "context",
    "ModelRequest": "model",
    "ModelResponse": "model",
    "ModelCall": "chain",
    "Usage": "model",
    "before_model": "chain",
    "after_model": "chain",
    "tool_layer": "chain",
    "Message": "messages",
    "SystemMessage": "messages",
    "UserMessage": "messages",
    "AssistantMessage": "messages",
    "ToolCall": "messages",
    "ToolResult": "messages",
    "TextPart": "parts",
    "ImagePart": "parts",
    "DocumentPart": "parts",
    "Interrupt": "control",
    "StopWithFinal": "control",
    "Suspend": "control",
    "Approve": "decisions",
    "Edit": "decisions",
    "Reject": "decisions",
    "Respond": "decisions",
    "MemoryStore": "stores",
    "SqliteStore": "stores",
    "Event": "events",
    "EventSink": "events",
    "TinyCtxError": "errors",
    "ConfigError": "errors",
    "PairingError": "errors",
    "RunCancelled": "errors",
    "Interrupted": "errors",
    "ContextLimitExceeded": "errors",
    "LimitExceeded": "errors",
    "DepthLimitExceeded": "errors",
    "SessionBusy": "errors",
    "ResumeError": "errors",
    "ToolError": "errors",
    "ProviderError": "errors",
    "RetryableProviderError": "errors",
    "InvalidCheckpoint": "errors",
    "StoreError": "stores",
}


def __getattr__(name: str) -> object:
    """Import a root name's module when the name is first used."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# hypothesis imported first: its entry point (_tinyctx_hypothesis) left registering
# tinyctx's st.from_type strategies to the end of this import.
if _sys.modules.get("hypothesis") is not None:
    from .testing._hypothesis_hook import register_if_hypothesis_loaded as _register

    _register()
