"""Review decisions that last: "always approve" / "always reject" a tool, or a tool with
these arguments, for the rest of the thread (:meth:`Approvals.remember`).

Kept as the :class:`~middleware.approvals.Approvals` layer's per-thread state, so it is
written with the thread and holds in every later session of it, in any process, until
revoked (:meth:`Approvals.revoke`).
"""

from __future__ import annotations

import json
from typing import Any

from attrs import frozen

from tinyctx import Approve, Reject, ToolCall
from tinyctx.config import implements, optional, text
from tinyctx.frozen import thaw

__all__ = ["StandingDecision", "Standing", "standing_key"]


def standing_key(tool: str, arguments: Any) -> str:
    """One rule's key: the tool and its arguments as canonical JSON (None: any)."""
    args = None if arguments is None else json.dumps(thaw(arguments), sort_keys=True)
    return json.dumps([tool, args])


@frozen
class StandingDecision:
    """A decision that lasts: ``decision`` ("approve" or "reject") for every call of
    ``tool`` (with exactly ``arguments``, when given), with ``message`` told the model on
    a rejection."""

    tool: str
    decision: str
    arguments: Any = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "decision": self.decision}
        if self.arguments is not None:
            out["arguments"] = thaw(self.arguments)
        if self.message is not None:
            out["message"] = self.message
        return out

    @classmethod
    def from_json(cls, data: Any) -> StandingDecision:
        if not isinstance(data, dict) or data.get("decision") not in ("approve", "reject"):
            raise ValueError(f"a standing review decision must be approve or reject: {data!r}")
        tool, message = data.get("tool"), data.get("message")
        if not isinstance(tool, str) or not (message is None or isinstance(message, str)):
            raise ValueError(f"a standing review decision needs a tool name: {data!r}")
        return cls(tool, data["decision"], data.get("arguments"), message)

    def as_decision(self) -> Approve | Reject:
        return Approve() if self.decision == "approve" else Reject(self.message)


class Standing:
    """The thread's standing decisions, by :func:`standing_key`."""

    __slots__ = ("rules",)

    def __init__(self, rules: dict[str, StandingDecision] | None = None) -> None:
        self.rules: dict[str, StandingDecision] = rules if rules is not None else {}

    def match(self, call: ToolCall) -> StandingDecision | None:
        """The rule for ``call``: its tool with these arguments first, then the tool."""
        if not self.rules:
            return None
        exact = self.rules.get(standing_key(call.name, call.arguments))
        return exact if exact is not None else self.rules.get(standing_key(call.name, None))

    def to_json(self) -> list[dict[str, Any]]:
        return [rule.to_json() for _, rule in sorted(self.rules.items())]

    @classmethod
    def from_json(cls, data: Any) -> Standing:
        if not isinstance(data, list):
            raise TypeError("standing review decisions must be a JSON array")
        rules = [StandingDecision.from_json(item) for item in data]
        return cls({standing_key(r.tool, r.arguments): r for r in rules})


_TOOL = text(allowed="a tool name (a non-empty str)")
_DECISION = implements((Approve, Reject), allowed="Approve() or Reject(message)")
_ARGUMENTS = optional(implements(dict), allowed="None (any call) or a dict of arguments")


def check_standing(tool: object, decision: object, arguments: object) -> StandingDecision:
    """The rule ``remember`` stores, or a ConfigError naming the bad argument."""
    name = _TOOL.check(tool, "tool", "Approvals.remember")
    chosen: Approve | Reject = _DECISION.check(decision, "decision", "Approvals.remember")
    _ARGUMENTS.check(arguments, "arguments", "Approvals.remember")
    message = chosen.message if isinstance(chosen, Reject) else None
    return StandingDecision(name, chosen.kind, arguments, message)
