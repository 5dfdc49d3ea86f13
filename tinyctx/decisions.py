"""A reviewer's decisions on paused tool calls, handed to ``Session.resume(decisions=...)``.

A run paused for review (an :class:`~tinyctx.Interrupt` whose payload lists the calls) is
resumed with one decision per call id:

* :class:`Approve` runs the call as the model asked;
* :class:`Edit` runs it with new ``arguments`` (checked against the tool's schema);
* :class:`Reject` does not run it; the model reads that it was rejected (and ``message``);
* :class:`Respond` does not run it; the reviewer's ``text`` is the call's result.

Decisions are plain values with a JSON form (:meth:`to_json` / :func:`decision_from_json`),
so a review UI can send them over HTTP and a worker in another process can resume with
them. The kernel only carries them to the layers (``Layer.on_resume``); what they mean is
the approval layer's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeAlias

from attrs import field, frozen
from attrs.validators import instance_of, optional

from .frozen import FrozenDict, frozen_mapping, thaw

__all__ = [
    "Approve",
    "Edit",
    "Reject",
    "Respond",
    "Decision",
    "DecisionKind",
    "DECISION_KINDS",
    "decision_from_json",
    "decisions_from_json",
]

DecisionKind = Literal["approve", "edit", "reject", "respond"]
DECISION_KINDS: tuple[DecisionKind, ...] = ("approve", "edit", "reject", "respond")


@frozen
class Approve:
    """Run the call as the model asked."""

    kind: ClassVar[DecisionKind] = "approve"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind}


@frozen
class Edit:
    """Run the call with ``arguments`` instead; the history shows what actually ran."""

    arguments: FrozenDict[str, Any] = field(converter=frozen_mapping)
    kind: ClassVar[DecisionKind] = "edit"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "arguments": thaw(self.arguments)}


@frozen
class Reject:
    """Do not run the call; the model is told it was rejected (with ``message`` if given)."""

    message: str | None = field(default=None, validator=optional(instance_of(str)))
    kind: ClassVar[DecisionKind] = "reject"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.message is not None:
            out["message"] = self.message
        return out


@frozen
class Respond:
    """Do not run the call; ``text`` (the reviewer's answer) is its result."""

    text: str = field(validator=instance_of(str))
    kind: ClassVar[DecisionKind] = "respond"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "text": self.text}


Decision: TypeAlias = Approve | Edit | Reject | Respond
DECISION_TYPES: tuple[type, ...] = (Approve, Edit, Reject, Respond)


def decision_from_json(document: Mapping[str, Any], *, path: str = "decision") -> Decision:
    """The decision a JSON object describes (``{"type": "edit", "arguments": {...}}``).

    A malformed document is a ValueError naming ``path`` and what was expected.
    """
    if not isinstance(document, Mapping):
        raise ValueError(f"{path}: expected an object, got {type(document).__name__}")  # noqa: TRY004
    kind = document.get("type")
    expected: dict[str, set[str]] = {
        "approve": set(),
        "edit": {"arguments"},
        "reject": {"message"},
        "respond": {"text"},
    }
    if kind not in expected:
        raise ValueError(f"{path}.type: expected one of {list(DECISION_KINDS)}, got {kind!r}")
    unknown = set(document) - {"type"} - expected[kind]
    if unknown:
        raise ValueError(f"{path}: unexpected field(s) {sorted(unknown)} for a {kind!r} decision")
    if kind == "approve":
        return Approve()
    if kind == "edit":
        arguments = document.get("arguments")
        if not isinstance(arguments, Mapping):
            raise ValueError(f"{path}.arguments: expected an object, got {arguments!r}")
        return Edit(arguments)
    if kind == "reject":
        message = document.get("message")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"{path}.message: expected a string or null, got {message!r}")
        return Reject(message)
    text = document.get("text")
    if not isinstance(text, str):
        raise ValueError(f"{path}.text: expected a string, got {text!r}")  # noqa: TRY004
    return Respond(text)


def decisions_from_json(document: Mapping[str, Any]) -> dict[str, Decision]:
    """``{call_id: decision}`` from ``{call_id: {"type": ...}, ...}`` (as a UI posts it)."""
    if not isinstance(document, Mapping):
        raise ValueError(  # noqa: TRY004 - a malformed JSON document is a bad value
            f"decisions: expected an object, got {type(document).__name__}"
        )
    return {
        str(call_id): decision_from_json(value, path=f"decisions[{call_id!r}]")
        for call_id, value in document.items()
    }
