"""The guard's events: pressure, each policy applied, failed or skipped, breakers, exhaustion."""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import field, frozen

from tinyctx import Event
from tinyctx.events import EventLevel
from tinyctx.frozen import FrozenDict


@frozen
class ContextPressure(Event):
    """The prompt reached the trigger; policies are about to run."""

    kind: ClassVar[str] = "context.pressure"
    level: ClassVar[EventLevel] = "info"
    utilisation: float = 0.0
    estimate: int = 0
    usable: int = 0
    window: int = 0
    reserved: int = 0
    trigger_tokens: int = 0
    target_tokens: int = 0
    window_source: str = ""
    model: str | None = None
    provider_rejected: bool = False

    def describe(self) -> str:
        return f"pressure {self.utilisation:.0%}"


@frozen
class ContextPolicyApplied(Event):
    """One policy changed the history; ``freed_tokens`` is the drop of the estimate."""

    kind: ClassVar[str] = "context.policy_applied"
    level: ClassVar[EventLevel] = "info"
    policy: str = ""
    freed_tokens: int = 0
    estimate_before: int = 0
    estimate_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    persisted: bool = False
    detail: FrozenDict[str, Any] = field(factory=FrozenDict)

    def describe(self) -> str:
        return f"{self.policy} -{self.freed_tokens}"


@frozen
class ContextPolicyFailed(Event):
    """A policy raised or broke the policy contract; the history is as it was."""

    kind: ClassVar[str] = "context.policy_failed"
    level: ClassVar[EventLevel] = "warning"
    policy: str = ""
    error_type: str = ""
    error: str = ""
    breaker_group: str | None = None
    failures: int = 0

    def describe(self) -> str:
        return f"{self.policy} failed ({self.error_type})"


@frozen
class ContextPolicySkipped(Event):
    """A policy was not run (its circuit breaker is open)."""

    kind: ClassVar[str] = "context.policy_skipped"
    level: ClassVar[EventLevel] = "info"
    policy: str = ""
    reason: str = ""

    def describe(self) -> str:
        return f"{self.policy} skipped"


@frozen
class BreakerChanged(Event):
    """A circuit breaker opened (after consecutive failures) or closed (after a success)."""

    kind: ClassVar[str] = "context.breaker"
    level: ClassVar[EventLevel] = "warning"
    group: str = ""
    state: str = ""
    failures: int = 0

    def describe(self) -> str:
        return f"breaker {self.group} {self.state}"


@frozen
class ContextExhausted(Event):
    """Every policy ran and the prompt is still over the hard limit."""

    kind: ClassVar[str] = "context.exhausted"
    level: ClassVar[EventLevel] = "error"
    estimate: int = 0
    usable: int = 0
    window: int = 0
    reserved: int = 0
    limit: int = 0
    freed: FrozenDict[str, int] = field(factory=FrozenDict)

    def describe(self) -> str:
        return f"exhausted ({self.estimate} > {self.limit})"


@frozen
class ProviderContextLimit(Event):
    """The provider rejected a prompt the guard had let through."""

    kind: ClassVar[str] = "context.provider_limit"
    level: ClassVar[EventLevel] = "warning"
    estimate: int = 0
    provider_estimate: int | None = None
    error: str = ""
    retrying: bool = False
