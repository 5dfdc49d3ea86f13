"""The one exception hierarchy of tinyctx.

Everything the framework raises on purpose derives from :class:`TinyCtxError`, so an
application can catch "anything tinyctx decided" in one place. Errors about bad input are
also :class:`ValueError` so generic validation code keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent import Checkpoint

__all__ = [
    "TinyCtxError",
    "ConfigError",
    "PairingError",
    "RunCancelled",
    "Interrupted",
    "InvalidCheckpoint",
    "ContextLimitExceeded",
    "LimitExceeded",
    "DepthLimitExceeded",
    "SessionBusy",
    "ProviderError",
    "RetryableProviderError",
]


class TinyCtxError(Exception):
    """Base of every error tinyctx raises on purpose."""


class ConfigError(TinyCtxError, ValueError):
    """Invalid configuration, raised at construction time.

    The message always names the field, the value that was given and what is allowed.
    """

    def __init__(self, field: str, value: object, allowed: str, *, owner: str = "") -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.owner = owner
        where = f"{owner}.{field}" if owner else field
        super().__init__(f"{where}={value!r} is invalid: allowed {allowed}")


class PairingError(TinyCtxError, ValueError):
    """A tool call without its result, or a tool result without its call."""

    def __init__(self, message: str, *, index: int, tool_call_id: str) -> None:
        self.index = index
        self.tool_call_id = tool_call_id
        super().__init__(message)


class RunCancelled(TinyCtxError):
    """The run's cancellation token was cancelled; raised at the named checkpoint."""

    def __init__(self, checkpoint: str = "", reason: str | None = None) -> None:
        self.checkpoint = checkpoint
        self.reason = reason
        text = "run cancelled"
        if checkpoint:
            text += f" at checkpoint {checkpoint!r}"
        if reason:
            text += f": {reason}"
        super().__init__(text)


class Interrupted(TinyCtxError):
    """The run paused on an Interrupt; ``checkpoint`` resumes it with ``Session.resume``."""

    def __init__(self, node: str, message: str, checkpoint: Checkpoint) -> None:
        self.node = node
        self.message = message
        self.checkpoint = checkpoint
        super().__init__(f"interrupted at node {node!r}: {message}")


class InvalidCheckpoint(TinyCtxError, ValueError):
    """A checkpoint that cannot be resumed as it is (corrupted or hand-edited); nothing ran."""


class ContextLimitExceeded(TinyCtxError):
    """The prompt does not fit the usable context window, even after every policy ran."""

    def __init__(
        self,
        message: str = "",
        *,
        estimate: int | None = None,
        window: int | None = None,
        reserved: int = 0,
        limit: int | None = None,
        freed: Mapping[str, int] | None = None,
        provider_message: str | None = None,
    ) -> None:
        self.estimate = estimate
        self.window = window
        self.reserved = reserved
        self.limit = limit
        self.freed: dict[str, int] = dict(freed or {})
        self.provider_message = provider_message
        if not message:
            parts = [f"prompt of ~{estimate} tokens does not fit"]
            if window is not None:
                parts.append(
                    f"window {window} - reserved output {reserved} = usable {window - reserved}"
                )
            if limit is not None:
                parts.append(f"hard limit {limit}")
            if self.freed:
                done = ", ".join(f"{name} freed {n}" for name, n in self.freed.items())
                parts.append(f"after policies: {done}")
            else:
                parts.append("no policy could free anything")
            if provider_message:
                parts.append(f"provider said: {provider_message}")
            message = "; ".join(parts)
        super().__init__(message)


class LimitExceeded(TinyCtxError):
    """A call limit (model calls, tool calls) was reached."""

    def __init__(self, limit: str, value: int, *, scope: str = "run") -> None:
        self.limit = limit
        self.value = value
        self.scope = scope
        super().__init__(f"{limit} limit of {value} per {scope} reached")


class DepthLimitExceeded(LimitExceeded):
    """``ctx.derive()`` would nest deeper than ``RunConfig.max_depth``."""

    def __init__(self, depth: int, max_depth: int) -> None:
        self.depth = depth
        self.max_depth = max_depth
        TinyCtxError.__init__(
            self,
            f"nesting depth {depth} exceeds max_depth={max_depth}; raise RunConfig.max_depth "
            "if this nesting is intended",
        )
        self.limit = "max_depth"
        self.value = max_depth
        self.scope = "tree"


class SessionBusy(TinyCtxError):
    """A session runs one run at a time; a second concurrent ``run()`` is refused."""


class ProviderError(TinyCtxError):
    """A model provider failed in a way the caller should see."""

    def __init__(self, message: str, *, status: int | None = None, provider: str = "") -> None:
        self.status = status
        self.provider = provider
        super().__init__(message)


class RetryableProviderError(ProviderError):
    """Rate limit, overload or a transient network failure: worth another attempt."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        provider: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status, provider=provider)
