"""Human review of tool calls: pause before they run, resume with a decision per call.

:class:`Approvals` watches the model's responses. When one holds calls that need review,
the run pauses with **one** :class:`~tinyctx.Interrupt` (node = the layer's name) whose
payload lists every call under review::

    {"type": "tool_review",
     "calls": [{"id": "call_1", "name": "delete_file", "arguments": {"path": "/tmp/x"},
                "description": "...", "allowed": ["approve", "edit", "reject"]}, ...]}

Nothing of that batch runs before the review: calls that need no review run on resume,
together with the reviewed ones, in the order the model asked for them, so the history
keeps the call order and every call gets exactly one result.

The review UI answers with ``session.resume(checkpoint, decisions={call_id: decision})``:

* :class:`~tinyctx.Approve`: the call runs as is;
* :class:`~tinyctx.Edit`: the call runs with the new arguments, checked against the tool's
  schema first; the assistant message in history is rewritten to show them (the original
  arguments are kept in its ``metadata["tinyctx"]["review"]["edited"]``), so the model sees
  what actually ran;
* :class:`~tinyctx.Reject`: the call does not run; its error result tells the model that the
  reviewer rejected it (with the reviewer's message, if any);
* :class:`~tinyctx.Respond`: the call does not run; the reviewer's text is its result.

A missing decision, a decision of a kind the tool does not allow, a decision for a call
that is not under review, or edited arguments that fail the schema raise
:class:`~tinyctx.ResumeError` listing every problem, before anything runs; the session is
still paused on the same checkpoint and can be resumed with corrected decisions.

Which calls need review:

* a tool name, or several: ``Approvals("delete_file")``, ``Approvals(["a", "b"])``;
* a mapping of tool name to ``True`` / ``False`` / a :class:`Review` (the decisions allowed,
  the description shown to the reviewer, and a predicate ``when(call)`` so only some calls
  of that tool are reviewed);
* a function deciding per call, ``review(call) -> Review | bool | None``.

Decisions that last: ``await approvals.remember(session.ctx, "deploy", Approve())`` (or
``Reject("...")``, or ``arguments={...}`` for one exact call) decides every later call of
the tool for the rest of the thread without asking anyone; it is the layer's thread state
(stored with the thread, so it holds in later sessions and other processes) until
``await approvals.revoke(session.ctx, "deploy")``. ``approvals.standing(ctx)`` lists them.

The decisions are durable run state (``ctx.run_state``): when a resumed run pauses again
before its reviewed calls ran (a tool asked for another pause), they travel in that
checkpoint, so a resume in another process still runs what the reviewer approved.

A response that already carries a control outcome is left as it is: a stop means its calls
never run, and another pause wins the response; when that run resumes, this layer pauses it
again (``on_run_start``) for the calls still waiting for a review, before any of them runs.
A call that needs review and still reaches the tool onion without a decision is never run:
it gets an error result saying it was not reviewed.

A call that could not run anyway (its arguments are not a JSON object or fail the tool's
schema, or the tool is unknown) is not put to a reviewer: it gets the same validation
error a call of an unreviewed tool gets (a :class:`~tinyctx.ToolError` the loop answers
as an ``is_error`` result), so the model corrects it; its corrected call is reviewed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeAlias

import attrs
from attrs import field, frozen

from tinyctx import (
    Approve,
    AssistantMessage,
    Edit,
    Event,
    Interrupt,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    Reject,
    Respond,
    ResumeError,
    RunContext,
    ToolCall,
    ToolResult,
)
from tinyctx.agent import Checkpoint
from tinyctx.chain import ToolCallHandler
from tinyctx.config import Check, each, function, one_of, optional, text
from tinyctx.decisions import DECISION_KINDS, Decision, DecisionKind, decisions_from_json
from tinyctx.events import EventLevel
from tinyctx.frozen import thaw
from tinyctx.messages import pending_tool_calls
from tinyctx.ordering import Once
from tinyctx.tools import ToolArgumentError

from ._runnable import unrunnable as _unrunnable
from ._standing import Standing, StandingDecision, check_standing, standing_key

__all__ = [
    "Approvals",
    "Review",
    "ReviewRequested",
    "ReviewDecided",
    "REVIEW_PAYLOAD_TYPE",
    "review_calls",
    "StandingDecision",
]

REVIEW_PAYLOAD_TYPE = "tool_review"
NOT_REVIEWED = "[not run: this call of {name!r} needs human review and no decision was given]"
REJECTED = "Rejected by the reviewer: this call of {name!r} was not run."
REJECTED_WITH_MESSAGE = REJECTED + " The reviewer said: {message}"


def _as_tuple(value: Any) -> Any:
    """One decision kind or a collection of them, as a tuple (anything else as it is, for
    the validator to name)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple | set | frozenset):
        return tuple(value)
    return value


_ALLOWED_KINDS = each(
    one_of(DECISION_KINDS),
    empty=False,
    distinct=True,
    allowed=f"a non-empty collection of distinct decision kinds from {list(DECISION_KINDS)}",
)


_description: Check[str | Callable[[ToolCall], str] | None] = Check(
    lambda value: value is None or isinstance(value, str) or callable(value),
    "a string, a function (call) -> str, or None",
)
_predicate = optional(function(), allowed="a function (call) -> bool, or None")


@frozen
class Review:
    """How the calls of one tool are reviewed.

    ``allowed``: the decisions the reviewer may give (default: all four). ``description``:
    what the reviewer is shown, a string or a function of the call (default: the tool's
    name and arguments). ``when``: a predicate on the call; only calls it accepts are
    reviewed (default: every call).
    """

    allowed: tuple[DecisionKind, ...] = field(
        default=DECISION_KINDS, converter=_as_tuple, validator=_ALLOWED_KINDS
    )
    description: str | Callable[[ToolCall], str] | None = field(
        default=None, validator=_description
    )
    when: Callable[[ToolCall], bool] | None = field(default=None, validator=_predicate)

    def describe(self, call: ToolCall) -> str:
        description = self.description
        if description is None:
            arguments = json.dumps(thaw(call.arguments), ensure_ascii=False, sort_keys=True)
            return f"Review the call to {call.name!r} before it runs; arguments: {arguments}"
        if isinstance(description, str):
            return description
        text = description(call)
        if not isinstance(text, str):
            raise TypeError(
                f"Review.description for {call.name!r} returned {type(text).__name__}, expected str"
            )
        return text


ReviewConfig: TypeAlias = (
    "str | Iterable[str] | Mapping[str, bool | Review] | Callable[[ToolCall], Review | bool | None]"
)


@frozen
class ReviewRequested(Event):
    """A run paused: the model asked for calls that need a human's review."""

    kind: ClassVar[str] = "review.requested"
    level: ClassVar[EventLevel] = "info"
    node: str = ""
    tool_call_ids: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()


@frozen
class ReviewDecided(Event):
    """A reviewer's decision was applied to a call (``decision``: approve, edit, ...)."""

    kind: ClassVar[str] = "review.decided"
    level: ClassVar[EventLevel] = "info"
    tool: str = ""
    tool_call_id: str = ""
    decision: str = ""


def review_calls(payload: Any) -> tuple[Mapping[str, Any], ...] | None:
    """The calls under review listed by an Approvals pause's payload (None for another)."""
    if not isinstance(payload, Mapping) or payload.get("type") != REVIEW_PAYLOAD_TYPE:
        return None
    calls = payload.get("calls")
    return tuple(calls) if isinstance(calls, tuple | list) else None


class _Decided:
    """The reviewer's decisions for one run (durable: they travel with a later checkpoint)."""

    __slots__ = ("decisions", "unshown")

    def __init__(self) -> None:
        self.decisions: dict[str, Decision] = {}
        self.unshown: list[str] = []  # edits not yet written into the history

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": {call_id: d.to_json() for call_id, d in self.decisions.items()},
            "unshown": list(self.unshown),
        }

    @classmethod
    def from_json(cls, data: Any) -> _Decided:
        decided = cls()
        decided.decisions = decisions_from_json(data.get("decisions", {}))
        decided.unshown = [str(call_id) for call_id in data.get("unshown", ())]
        return decided


_DEFAULT = Review()
_REVIEW_FORMS: Check[ReviewConfig] = Check(
    lambda value: isinstance(value, Iterable) or callable(value),
    "a tool name, tool names, a mapping of tool name to True/False/Review, or a "
    "function (call) -> Review | bool | None",
)
_TOOL_NAMES = each(text(), allowed="tool names that are non-empty strings")
_SOME_TOOL_NAMES = each(text(), empty=False, allowed="at least one tool name, each non-empty")
_REVIEW_VALUE: Check[bool | Review] = Check(
    lambda value: isinstance(value, bool | Review), "True, False or a Review"
)


class Approvals(Layer):
    """Pause for a human's review of chosen tool calls (see the module doc)."""

    constraints = (
        Once(
            reason="a response pauses with one Interrupt: a second review layer's pause would "
            "lose to the first, and the calls only it reviews would go unreviewed"
        ),
    )

    def __init__(self, review: ReviewConfig, *, name: str | None = None) -> None:
        self._by_name: dict[str, Review] = {}
        self._decide: Callable[[ToolCall], Review | bool | None] | None = None
        _REVIEW_FORMS.check(review, "review", "Approvals")
        if isinstance(review, Mapping):
            _TOOL_NAMES.check(review.keys(), "review", "Approvals")
            for tool, value in review.items():
                _REVIEW_VALUE.check(value, f"review[{tool!r}]", "Approvals")
                if value is not False:
                    self._by_name[tool] = _DEFAULT if value is True else value
        elif callable(review):
            self._decide = review
        else:
            names = (review,) if isinstance(review, str) else tuple(review)
            _SOME_TOOL_NAMES.check(names, "review", "Approvals")
            self._by_name = dict.fromkeys(names, _DEFAULT)
        if name is not None:
            self.name = name

    # -- which calls -------------------------------------------------------------------------

    def review_for(self, call: ToolCall) -> Review | None:
        """How ``call`` is reviewed, or None when it runs without review."""
        review = self._by_name.get(call.name)
        if review is not None:
            when = review.when
            return review if when is None or when(call) else None
        decide = self._decide
        if decide is None:
            return None
        verdict = decide(call)
        if verdict is None or verdict is False:
            return None
        if verdict is True:
            return _DEFAULT
        if isinstance(verdict, Review):
            return verdict
        raise TypeError(
            f"Approvals review function returned {type(verdict).__name__} for {call.name!r}; "
            "expected a Review, a bool or None"
        )

    # -- the pause ---------------------------------------------------------------------------

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        calls = response.message.tool_calls
        if not calls:
            return response
        if self._decide is None:
            # the common case, kept cheap: no call of a named tool, nothing to decide
            by_name = self._by_name
            for call in calls:
                if call.name in by_name:
                    break
            else:
                return response
        if response.control is not None:
            # a stop means the calls never run; another pause wins the response (ties keep
            # the first) and this layer asks for the review when that run resumes
            return response
        reviewed = self._under_review(ctx, calls, {})
        if not reviewed:
            return response
        return response.evolve(control=self._pause(ctx, reviewed))

    def _under_review(
        self, ctx: RunContext[Any], calls: Iterable[ToolCall], decided: Mapping[str, Decision]
    ) -> list[tuple[ToolCall, Review]]:
        """The calls a person must decide: those that need review and could run (a call
        whose arguments fail its tool's schema goes back to the model instead)."""
        out = []
        standing: Standing | Literal[False] | None = None
        for call in calls:
            if call.id in decided:
                continue
            review = self.review_for(call)
            if review is None or _unrunnable(ctx, call) is not None:
                continue
            if standing is None:
                standing = self._standing(ctx) or False
            if standing and standing.match(call) is not None:
                continue  # decided for the rest of the thread
            out.append((call, review))
        return out

    # -- decisions that last -----------------------------------------------------------------

    def _standing(self, ctx: RunContext[Any]) -> Standing | None:
        """The thread's standing decisions, if any were ever remembered (never creates)."""
        if self.name not in ctx.conversation.layer_state:
            return None
        return ctx.thread_state(self, Standing)

    async def remember(
        self,
        ctx: RunContext[Any],
        tool: str,
        decision: Approve | Reject,
        *,
        arguments: Mapping[str, Any] | None = None,
    ) -> StandingDecision:
        """Decide every later call of ``tool`` (with exactly ``arguments``, when given) for
        the rest of the thread: ``Approve()`` runs them unreviewed, ``Reject(message)``
        answers them as rejected. Stored as the thread's state (written now when the
        session has a store); an exact-arguments rule wins over a tool-wide one.
        ``ctx`` is the session's (``session.ctx``) or a run's context."""
        rule = check_standing(tool, decision, None if arguments is None else dict(arguments))
        standing = ctx.thread_state(self, Standing)
        standing.rules[standing_key(rule.tool, rule.arguments)] = rule
        await ctx.commit()
        return rule

    async def revoke(
        self, ctx: RunContext[Any], tool: str, *, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        """Drop the standing decision for ``tool`` (with ``arguments``: that rule only);
        later calls are reviewed again. False when there was none."""
        standing = self._standing(ctx)
        key = standing_key(tool, None if arguments is None else dict(arguments))
        if standing is None or standing.rules.pop(key, None) is None:
            return False
        await ctx.commit()
        return True

    def standing(self, ctx: RunContext[Any]) -> tuple[StandingDecision, ...]:
        """The thread's standing decisions, ordered by tool and arguments."""
        standing = self._standing(ctx)
        if standing is None:
            return ()
        return tuple(rule for _, rule in sorted(standing.rules.items()))

    def _pause(self, ctx: RunContext[Any], reviewed: list[tuple[ToolCall, Review]]) -> Interrupt:
        """The one Interrupt listing every call under review (and its event)."""
        payload = {
            "type": REVIEW_PAYLOAD_TYPE,
            "calls": [
                {
                    "id": call.id,
                    "name": call.name,
                    "arguments": thaw(call.arguments),
                    "description": review.describe(call),
                    "allowed": list(review.allowed),
                }
                for call, review in reviewed
            ],
        }
        count = len(reviewed)
        message = f"{count} tool call{'s' if count != 1 else ''} need{'' if count != 1 else 's'}"
        ctx.emit(
            ReviewRequested(
                node=self.name,
                tool_call_ids=tuple(c.id for c, _ in reviewed),
                tools=tuple(c.name for c, _ in reviewed),
            )
        )
        return Interrupt(self.name, f"{message} review", payload)

    # -- the resume --------------------------------------------------------------------------

    async def on_resume(
        self, ctx: RunContext[Any], checkpoint: Checkpoint, decisions: Mapping[str, Decision]
    ) -> bool:
        if checkpoint.node != self.name:
            return False
        under_review = review_calls(checkpoint.payload)
        if under_review is None:
            raise ResumeError(
                [
                    f"the checkpoint paused by {self.name!r} has no review payload (was it "
                    "stored by a store that does not keep Checkpoint.payload?); nothing can "
                    "be matched to the calls under review"
                ]
            )
        problems: list[str] = []
        ids = [str(c.get("id")) for c in under_review]
        for call_id in decisions:
            if call_id not in ids:
                problems.append(
                    f"decision for unknown call id {call_id!r} (calls under review: "
                    f"{', '.join(map(repr, ids))})"
                )
        edits: dict[str, Edit] = {}
        for entry in under_review:
            call_id, tool_name = str(entry.get("id")), str(entry.get("name"))
            allowed = tuple(entry.get("allowed") or ())
            decision = decisions.get(call_id)
            if decision is None:
                problems.append(
                    f"missing decision for call {call_id!r} ({tool_name}); allowed: "
                    f"{', '.join(allowed)}"
                )
                continue
            if decision.kind not in allowed:
                problems.append(
                    f"decision {decision.kind!r} is not allowed for call {call_id!r} "
                    f"({tool_name}); allowed: {', '.join(allowed)}"
                )
                continue
            if isinstance(decision, Edit):
                problem = _edit_problem(ctx, tool_name, decision)
                if problem is not None:
                    problems.append(f"edited arguments for call {call_id!r} {problem}")
                    continue
                edits[call_id] = decision
        if problems:
            raise ResumeError(problems)
        decided = ctx.run_state(self, _Decided)
        # added to the run's earlier decisions: calls decided before a later pause keep theirs
        decided.decisions.update((call_id, decisions[call_id]) for call_id in ids)
        decided.unshown = [*decided.unshown, *edits]
        return True

    def _decided(self, ctx: RunContext[Any]) -> _Decided | None:
        """This run's decisions, if it was resumed with some (never creates state)."""
        states = ctx.run_states.of(ctx.config.agent_run_id or ctx.config.run_id)
        return states.get(self, _Decided) if self.name in states else None

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        decided = self._decided(ctx)
        # a resumed run whose pending calls need a review nobody gave yet (another layer's
        # pause won their response): pause again, before the first of them runs
        pending = pending_tool_calls(ctx.conversation.messages)
        if pending:
            reviewed = self._under_review(ctx, pending, decided.decisions if decided else {})
            if reviewed:
                ctx.request_control(self._pause(ctx, reviewed))
        if decided is not None and decided.unshown:
            edits = {
                call_id: decision
                for call_id in decided.unshown
                if isinstance(decision := decided.decisions.get(call_id), Edit)
            }
            decided.unshown = []
            _show_edits(ctx, edits)

    # -- applying the decisions --------------------------------------------------------------

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        decided = self._decided(ctx)
        decision = decided.decisions.get(call.id) if decided is not None else None
        if decision is None:
            if self.review_for(call) is None:
                return await call_next(call, ctx)
            unrunnable = _unrunnable(ctx, call)
            if unrunnable is not None:
                # what the tool itself would answer: the model reads the error and may
                # call again; nobody was asked to approve a call that cannot run
                raise unrunnable
            standing = self._standing(ctx)
            rule = standing.match(call) if standing is not None else None
            if rule is None:
                return ToolResult.for_call(
                    call,
                    NOT_REVIEWED.format(name=call.name),
                    is_error=True,
                    metadata={"tinyctx": {"synthetic": "not_reviewed"}},
                )
            decision = rule.as_decision()
        ctx.emit(ReviewDecided(tool=call.name, tool_call_id=call.id, decision=decision.kind))
        if isinstance(decision, Reject):
            text = (
                REJECTED.format(name=call.name)
                if decision.message is None
                else REJECTED_WITH_MESSAGE.format(name=call.name, message=decision.message)
            )
            return ToolResult.for_call(
                call, text, is_error=True, metadata={"tinyctx": {"review": "reject"}}
            )
        if isinstance(decision, Respond):
            return ToolResult.for_call(
                call, decision.text, metadata={"tinyctx": {"review": "respond"}}
            )
        if isinstance(decision, Edit) and call.arguments != decision.arguments:
            # the history already shows the edit (on_run_start); this covers a call that
            # reached the onion by another road
            call = attrs.evolve(call, arguments=decision.arguments)
        return await call_next(call, ctx)


def _edit_problem(ctx: RunContext[Any], tool_name: str, decision: Edit) -> str | None:
    tool = ctx.tools.get(tool_name)
    if tool is None:
        return f"cannot be checked: the tool {tool_name!r} is not available"
    try:
        tool.check_arguments(decision.arguments)
    except ToolArgumentError as exc:
        return f"fail the schema of {tool_name!r}: {'; '.join(exc.problems)}"
    return None


def _show_edits(ctx: RunContext[Any], edits: Mapping[str, Edit]) -> None:
    """Rewrite the paused assistant message so history shows the arguments that will run."""
    messages = list(ctx.conversation.messages)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, AssistantMessage):
            continue
        if not any(c.id in edits for c in message.tool_calls):
            continue
        originals = {c.id: thaw(c.arguments) for c in message.tool_calls if c.id in edits}
        calls = tuple(
            attrs.evolve(c, arguments=edits[c.id].arguments) if c.id in edits else c
            for c in message.tool_calls
        )
        meta = thaw(message.metadata)
        tinyctx_meta = dict(meta.get("tinyctx") or {})
        review_meta = dict(tinyctx_meta.get("review") or {})
        review_meta["edited"] = {**review_meta.get("edited", {}), **originals}
        tinyctx_meta["review"] = review_meta
        meta["tinyctx"] = tinyctx_meta
        rewritten: Message = message.evolve(tool_calls=calls, metadata=meta)
        messages[index] = rewritten
        ctx.conversation.replace(messages, emit_new=False)
        return
