"""The one exception hierarchy of tinyctx.

Everything the framework raises on purpose derives from :class:`TinyCtxError`, so an
application can catch "anything tinyctx decided" in one place. Errors about bad input are
also :class:`ValueError` so generic validation code keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .messages import ToolCall

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
    "ToolError",
    "ResumeError",
    "ProviderError",
    "RetryableProviderError",
]


def a_type(kind: type) -> str:
    """A type's name with its article, for error messages: "a dict", "an int"."""
    name = kind.__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


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

    @property
    def payload(self) -> Any:
        """The Interrupt's structured payload (JSON data, deep-frozen), or None."""
        return self.checkpoint.payload


class ResumeError(TinyCtxError, ValueError):
    """``Session.resume`` refused its input (decisions missing, not allowed, unknown, or
    edited arguments that fail the tool's schema). Nothing ran; the session is still
    paused on the same checkpoint. ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("cannot resume: " + "; ".join(self.problems))


class ToolError(TinyCtxError):
    """A tool failed: it raised ``error``, is unknown, or got arguments it cannot take.

    Raised by the core tool handler so tool layers can see (and retry) the failure; the
    loop turns it into an ``is_error`` result the model can read at the onion's outer
    edge. ``error_type`` names the failure for the model (``UnknownTool``,
    ``InvalidArguments`` or the exception's type name) and ``text`` describes it.
    """

    def __init__(
        self,
        call: ToolCall,
        error_type: str,
        text: str,
        error: BaseException | None = None,
        *,
        content: str | None = None,
    ) -> None:
        self.call = call
        self.error_type = error_type
        self.text = text
        self.error = error
        self.content = f"Error ({error_type}): {text}" if content is None else content
        """What the model reads when this failure becomes a result."""
        super().__init__(f"tool {call.name!r} (call {call.id!r}) failed: {error_type}: {text}")

    def with_content(self, content: str) -> ToolError:
        """The same failure, answered with ``content`` (a layer shortening the text)."""
        return ToolError(self.call, self.error_type, self.text, self.error, content=content)


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

    def __init__(
        self,
        limit: str,
        value: int,
        *,
        scope: str = "run",
        hits: Sequence[tuple[str, int, str]] = (),
    ) -> None:
        self.limit = limit
        self.value = value
        self.scope = scope
        self.hits: tuple[tuple[str, int, str], ...] = tuple(hits) or ((limit, value, scope),)
        """Every limit the same call reached, ``(limit, value, scope)``, this one first."""
        super().__init__(
            " and ".join(f"{name} limit of {n} per {where}" for name, n, where in self.hits)
            + " reached"
        )


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
