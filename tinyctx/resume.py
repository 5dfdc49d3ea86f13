"""The resume and review path of a session: continue a paused run, check a reviewer's
decisions without running anything, recover a step a dead worker left open.

A checkpoint given back must be the pause the session (or its stored thread) is on, so an
approval never runs its calls twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import attrs

from .checkpoint import Checkpoint, RunResult
from .codec import CodecError, encode_checkpoint, encode_messages
from .config import one_of
from .context import RunContext
from .control import Resumption
from .decisions import DECISION_TYPES, Decision
from .durable import ENGINE_STATE, AbandonedStepClosed
from .errors import InvalidCheckpoint, ResumeError, SessionBusy
from .events import PendingCallsAnswered
from .frozen import EMPTY, FrozenDict
from .messages import Message, answer_pending, call_ids
from .model import Usage
from .run_input import check_input, input_messages
from .run_loop import RunLoop
from .run_state import RunState
from .suspension import take_suspension
from .synthetic import SKIPPED_ON_ABANDON, SKIPPED_ON_CRASH

__all__ = ["ENGINE_STATE", "ResumePath", "refuse_engine_thread"]

Data = TypeVar("Data")

_RECOVER_MODE = one_of(("continue", "close"), allowed="'continue' or 'close'")


def refuse_engine_thread(ctx: RunContext[Any], owner: str | None = None) -> None:
    """SessionBusy when a workflow other than ``owner``'s owns the thread's run."""
    states = ctx.conversation.layer_state
    if ENGINE_STATE not in states:
        return
    mark = states.dump(check=False).get(ENGINE_STATE)
    workflow = mark.get("workflow_id") if isinstance(mark, Mapping) else None
    if owner is not None and isinstance(mark, Mapping) and mark.get("owner") == owner:
        return  # the workflow's own session
    raise SessionBusy(
        f"thread {ctx.thread_id!r} is run by the durable workflow {workflow!r}: its engine "
        "finishes the run when it restarts, and its pause's decisions go to that workflow "
        "(the engine's decide); recovering, resuming or running it here would run its calls "
        "a second time or mix the two approval modes on one thread"
    )


class ResumePath(RunLoop[Data]):
    """A session's way back into a paused or abandoned run: ``resume``, its dry run
    ``check_resume``, and ``recover`` for a step a dead worker left open."""

    async def recover(self, mode: Literal["continue", "close"]) -> RunResult | None:
        """Finish the step a dead worker left open (see :attr:`abandoned`).

        ``"continue"`` runs the unanswered tool calls and goes on as a new run (returns
        its result; the dead run's per-run counts are gone with it). ``"close"`` answers
        them with a result saying the worker stopped while they were due, so the model
        knows they may or may not have run (returns None). Either way pairing holds and
        the thread is written. A later ``run()`` closes an abandoned step by itself.

        A thread whose run a durable-engine workflow owns (:mod:`tinyctx.engines`) is
        refused with :class:`SessionBusy`: the engine finishes it when it restarts, and a
        recover here would run its calls a second time.
        """
        _RECOVER_MODE.check(mode, "mode", "Session.recover")
        await self._ready()
        self._enter_run()
        try:
            calls = self._abandoned
            if not calls:
                raise InvalidCheckpoint(
                    f"thread {self._base.thread_id!r} has no abandoned step to recover"
                )
            refuse_engine_thread(self._base)
            if mode == "close":
                await self._close_abandoned()
                await self._sync()
                return None
            ctx = self._base._for_run()
            state = RunState(ctx, usage_before=Usage())
            return await self._drive(state, "tools", calls, input=(), resumed=False)
        finally:
            self._busy = False

    async def _close_abandoned(self) -> None:
        ctx = self._base
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_CRASH, reason="abandoned")
        for result in results:
            await ctx.conversation.append(result)
        ids = tuple(r.tool_call_id for r in results)
        if results:
            ctx.emit(
                PendingCallsAnswered, reason="the worker running them stopped", tool_call_ids=ids
            )
        ctx.emit(AbandonedStepClosed, mode="close", tool_call_ids=ids)
        self._abandoned = ()

    async def resume(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        input: str | Message | Sequence[Message] | None = None,
    ) -> RunResult:
        """Continue an interrupted run from its checkpoint (same run id, same counters).

        Without ``checkpoint`` the session's paused run is resumed (the one a store loaded,
        or this session's own last interrupt). The checkpoint is checked first
        (:meth:`Checkpoint.check`), and it must be the pause the session (or its stored
        thread) is on, or be given to a fresh session without a store: one the thread went
        on from (resumed or abandoned already) raises ``InvalidCheckpoint``, so an approval
        never runs its calls twice. ``decisions`` (one per call id, e.g.
        ``{"call_1": Approve()}``) reach the layers' ``on_resume`` hooks before anything
        runs; a refused input raises :class:`~tinyctx.ResumeError`. A resume that fails
        before the run goes on (refused decisions, a run-start hook raised, the caller
        cancelled) leaves the session paused on the same checkpoint.

        ``input`` (text, a message or messages, as :meth:`run` takes) is the user's new
        message: it is added after the decided calls' results, in the same write as the
        last of them (a crash never stores the answered calls without it), and the model
        then sees both. Input that would break the pairing rule raises ``PairingError``
        naming ``input[i]`` before anything runs. If the resumed calls pause the run again,
        the input is not added (pass it to that resume).
        """
        given = _checked_resume_args("resume", checkpoint, decisions)
        messages = input_messages(input)
        await self._ready()
        self._enter_run()
        try:
            checkpoint = self._resumable(checkpoint)
            refuse_engine_thread(self._base, self._link.owner if self._link else None)
            self._check_resume_input(checkpoint, messages)
            ctx, resumed_call = await self._take_decisions(checkpoint, given)
            if self._paused is not checkpoint:
                # a checkpoint from elsewhere (persisted, another session): restore its history
                self._base.conversation.replace(checkpoint.messages, emit_new=False)
                self._paused = checkpoint
            state = RunState(ctx, usage_before=checkpoint.usage)
            state.added.extend(checkpoint.added)
            state.model_calls = checkpoint.model_calls
            state.tool_calls = checkpoint.tool_calls
            state.resuming = checkpoint
            state.resumed_call = resumed_call
            if checkpoint.phase == "tools":
                state.input_after_tools = messages  # after the decided calls' results
                messages = ()
            return await self._drive(
                state, checkpoint.phase, checkpoint.pending, input=messages, resumed=True
            )
        finally:
            self._busy = False

    def _check_resume_input(self, checkpoint: Checkpoint, messages: tuple[Message, ...]) -> None:
        """``PairingError`` (or ``CodecError``) for resume input that could not follow the
        paused run's answered calls; nothing changes."""
        if not messages:
            return
        used = self._call_ids() | call_ids(checkpoint.messages)
        check_input(checkpoint.messages, messages, used, paused=True)
        if self._link is not None:
            encode_messages(messages, path="input")

    async def check_resume(
        self,
        checkpoint: Checkpoint | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        input: str | Message | Sequence[Message] | None = None,
    ) -> None:
        """Raise what :meth:`resume` would raise before running anything (a checkpoint it
        refuses, ``ResumeError`` for decisions it refuses), and change nothing: a review UI
        checks a reviewer's decisions before it stores or posts them. The layers'
        ``on_resume`` hooks run on a copy of the run's state that is then dropped."""
        given = _checked_resume_args("check_resume", checkpoint, decisions)
        messages = input_messages(input)
        await self._ready()
        self._enter_run()
        try:
            checkpoint = self._resumable(checkpoint)
            self._check_resume_input(checkpoint, messages)
            ctx, _ = await self._take_decisions(checkpoint, given)
            ctx.run_states.pop(ctx.run_id)
        finally:
            self._busy = False

    def _resumable(self, checkpoint: Checkpoint | None) -> Checkpoint:
        """The checkpoint a resume continues: the given one if this session may resume it,
        else the paused run."""
        if checkpoint is None:
            checkpoint = self._paused
            if checkpoint is None:
                raise InvalidCheckpoint(
                    f"thread {self._base.thread_id!r} has no paused run to resume"
                )
        if checkpoint.thread_id != self._base.thread_id:
            raise ValueError(
                f"checkpoint belongs to thread {checkpoint.thread_id!r}, this session is "
                f"thread {self._base.thread_id!r}"
            )
        checkpoint.check()
        if checkpoint is not self._paused:
            return self._check_resumable(checkpoint)
        return checkpoint

    async def _take_decisions(
        self, checkpoint: Checkpoint, given: FrozenDict[str, Decision]
    ) -> tuple[RunContext[Data], tuple[str, Resumption] | None]:
        """The resumed run's context, its state loaded from the checkpoint and the decisions
        handed to the layers' ``on_resume`` hooks and to a suspended call's tool; on a
        refusal the run's state is dropped (the checkpoint still holds it)."""
        ctx = self._base._for_run(checkpoint.run_config)
        ctx.run_states.load(ctx.run_id, checkpoint.state)
        taken = False
        try:
            for layer in self.agent.resume_hooks:
                taken = bool(await layer.on_resume(ctx, checkpoint, given)) or taken
            resumed_call = await take_suspension(ctx, checkpoint, given)
            if given and not taken and resumed_call is None:
                raise ResumeError(
                    [
                        f"decisions were given for {sorted(given)}, but no layer takes "
                        f"decisions for the pause at node {checkpoint.node!r}"
                    ]
                )
        except BaseException:
            ctx.run_states.pop(ctx.run_id)  # the checkpoint still holds the run's state
            raise
        return ctx, resumed_call

    def _check_resumable(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint a resume given ``checkpoint`` continues.

        It must be the pause this session (or its stored thread) is on, or come to a fresh
        in-memory session: resuming one the conversation moved on from would roll the
        thread back to the pause and run the approved calls a second time (a
        double-clicked approval, a stale review page). The pause the session holds is the
        authority: a copy of it that differs in any field (a client that edited the run
        config, the layers' counters, the node or the payload) is a ResumeError, and the
        resume continues the session's own checkpoint."""
        paused = self._paused
        thread = self._base.thread_id
        if paused is not None:
            if not _same_pause(checkpoint, paused):
                raise InvalidCheckpoint(
                    f"thread {thread!r} is paused on another run ({_pause_label(paused)}), "
                    f"not on this checkpoint ({_pause_label(checkpoint)}); resume() with no "
                    "checkpoint resumes the run it is paused on"
                )
            _check_unedited(checkpoint, paused, stored=self._link is not None)
            return paused
        history = self._base.conversation.messages
        if self._link is None and (not history or history == checkpoint.messages):
            return checkpoint  # a fresh session takes a checkpoint from elsewhere
        raise InvalidCheckpoint(
            f"thread {thread!r} is not paused on this checkpoint ({_pause_label(checkpoint)}): "
            "its run was resumed or abandoned already, and the thread went on "
            f"({len(history)} messages, the checkpoint has {len(checkpoint.messages)})"
        )

    async def _abandon_pause(self) -> None:
        ctx = self._base
        results = answer_pending(ctx.conversation.messages, SKIPPED_ON_ABANDON, reason="abandoned")
        for result in results:
            await ctx.conversation.append(result)
        if results:
            ctx.emit(
                PendingCallsAnswered,
                reason="interrupted and not resumed",
                tool_call_ids=tuple(r.tool_call_id for r in results),
            )
        self._paused = None
        if self._link is not None:
            self._link.unpause()


def _same_pause(a: Checkpoint, b: Checkpoint) -> bool:
    """Whether two checkpoints are the same pause (one may be a decoded copy of the other,
    or a redacted one): the same run, at the same point, waiting on the same calls, over
    the same history (compared last: a copy's messages are equal, not identical)."""
    return a is b or (
        a.run_id == b.run_id
        and a.phase == b.phase
        and a.model_calls == b.model_calls
        and a.tool_calls == b.tool_calls
        and [c.id for c in a.pending] == [c.id for c in b.pending]
        and a.messages == b.messages
    )


def _check_unedited(given: Checkpoint, paused: Checkpoint, *, stored: bool) -> None:
    """``given`` must equal the pause the session holds in every field (with a store, as
    the documents the store keeps too, so a value edited to another JSON type of equal
    Python value, ``1`` for ``True``, is caught as well); else a ResumeError naming the
    fields that differ. Nothing has run."""
    names = [f.name for f in attrs.fields(Checkpoint)]
    edited = [name for name in names if getattr(given, name) != getattr(paused, name)]
    if not edited and stored:
        try:
            same = encode_checkpoint(given) == encode_checkpoint(paused)
        except CodecError as exc:
            raise ResumeError(
                [f"the checkpoint given cannot be stored as the thread's checkpoint is: {exc}"]
            ) from None
        if not same:
            edited = ["the stored document"]
    if edited:
        where = "the stored checkpoint" if stored else "the checkpoint this session holds"
        raise ResumeError(
            [
                f"the checkpoint given differs from {where} of run {paused.run_id!r} in "
                f"{', '.join(edited)}; resume() with no checkpoint resumes the pause as it "
                "was stored (hand a client the thread id, not the checkpoint document)"
            ]
        )


def _pause_label(checkpoint: Checkpoint) -> str:
    pending = ", ".join(repr(c.id) for c in checkpoint.pending) or "no calls"
    return f"run {checkpoint.run_id!r} at node {checkpoint.node!r}, pending {pending}"


def _checked_resume_args(
    verb: str, checkpoint: Checkpoint | None, decisions: Mapping[str, Decision] | None
) -> FrozenDict[str, Decision]:
    """The decisions of a resume (or its check), its checkpoint's type checked first."""
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"{verb} needs a Checkpoint, got {type(checkpoint).__name__}")
    return _checked_decisions(decisions)


def _checked_decisions(decisions: Mapping[str, Decision] | None) -> FrozenDict[str, Decision]:
    if decisions is None:
        return EMPTY
    if not isinstance(decisions, Mapping):
        raise TypeError(
            f"resume: decisions must be a mapping of call id to decision, got "
            f"{type(decisions).__name__}"
        )
    for call_id, decision in decisions.items():
        if not isinstance(call_id, str):
            raise TypeError(f"resume: decision keys must be call ids (str), got {call_id!r}")
        if not isinstance(decision, DECISION_TYPES):
            raise TypeError(
                f"resume: decisions[{call_id!r}] must be Approve, Edit, Reject or Respond, got "
                f"{type(decision).__name__}"
            )
    return FrozenDict._wrap(dict(decisions))
