"""tinyctx: manage what an LLM agent knows at run time.

An onion of middleware layers around one core ``call_model`` handler. The kernel (this
package) knows no concrete layer; the layer library is ``tinyctx.middleware``.
"""

from __future__ import annotations

from .agent import Agent, Checkpoint, RunResult, RunStatus, Session, execute_tool
from .cache import CacheRegistry
from .cancel import CancellationToken
from .chain import (
    Layer,
    LayerBus,
    LayerLike,
    ModelCall,
    ToolCallHandler,
    after_model,
    before_model,
    check_layer_names,
    compose,
    has_hook,
    layer_name,
    tool_layer,
)
from .context import RunConfig, RunContext, new_run_id
from .control import Control, ControlSlot, Interrupt, StopWithFinal, stronger
from .conversation import Conversation
from .errors import (
    ConfigError,
    ContextLimitExceeded,
    DepthLimitExceeded,
    Interrupted,
    LimitExceeded,
    PairingError,
    ProviderError,
    RetryableProviderError,
    RunCancelled,
    SessionBusy,
    TinyCtxError,
)
from .events import (
    BackgroundTaskFailed,
    Cancelled,
    ControlApplied,
    Event,
    EventSink,
    LimitHit,
    ModelCallFinished,
    ModelStreamDelta,
    PendingCallsAnswered,
    RunFinished,
    RunStarted,
    SubscriberFailed,
    ToolCallFinished,
    ToolFailed,
)
from .frozen import FrozenDict, freeze, thaw
from .messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    ToolTurn,
    UserMessage,
    answer_pending,
    check_pairing,
    pending_tool_calls,
    safe_boundaries,
    snap_boundary,
    tool_turns,
)
from .model import ModelHandler, ModelRequest, ModelResponse, Usage
from .stores import MemoryStore, Note, Store, StoreRegistry
from .tasks import BackgroundTasks
from .tokens import (
    Calibration,
    HeuristicCounter,
    MemoCounter,
    TokenCounter,
    TokenizersCounter,
    context_window,
    default_counter,
)
from .tools import ServerTool, Tool, ToolRegistry, ToolSpec
from .usage import CostTracker, Price, UsageTracker

__version__ = "0.1.0.dev0"

__all__ = [
    # context
    "RunConfig",
    "RunContext",
    "new_run_id",
    "CancellationToken",
    "CacheRegistry",
    "BackgroundTasks",
    "UsageTracker",
    "CostTracker",
    "Price",
    # control
    "Control",
    "ControlSlot",
    "StopWithFinal",
    "Interrupt",
    "stronger",
    # messages
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolCall",
    "ToolResult",
    "ToolTurn",
    "check_pairing",
    "pending_tool_calls",
    "answer_pending",
    "safe_boundaries",
    "snap_boundary",
    "tool_turns",
    "Conversation",
    "FrozenDict",
    "freeze",
    "thaw",
    # model
    "ModelRequest",
    "ModelResponse",
    "ModelHandler",
    "Usage",
    # onion
    "Layer",
    "LayerLike",
    "LayerBus",
    "ModelCall",
    "ToolCallHandler",
    "compose",
    "before_model",
    "after_model",
    "tool_layer",
    "layer_name",
    "has_hook",
    "check_layer_names",
    # tokens
    "TokenCounter",
    "MemoCounter",
    "HeuristicCounter",
    "TokenizersCounter",
    "Calibration",
    "context_window",
    "default_counter",
    # tools
    "Tool",
    "ToolSpec",
    "ServerTool",
    "ToolRegistry",
    "execute_tool",
    # agent
    "Agent",
    "Session",
    "RunResult",
    "RunStatus",
    "Checkpoint",
    # stores
    "Store",
    "StoreRegistry",
    "MemoryStore",
    "Note",
    # events
    "Event",
    "EventSink",
    "RunStarted",
    "RunFinished",
    "ModelCallFinished",
    "ModelStreamDelta",
    "ToolCallFinished",
    "ToolFailed",
    "ControlApplied",
    "Cancelled",
    "LimitHit",
    "PendingCallsAnswered",
    "BackgroundTaskFailed",
    "SubscriberFailed",
    # errors
    "TinyCtxError",
    "ConfigError",
    "PairingError",
    "RunCancelled",
    "Interrupted",
    "ContextLimitExceeded",
    "LimitExceeded",
    "DepthLimitExceeded",
    "SessionBusy",
    "ProviderError",
    "RetryableProviderError",
]
