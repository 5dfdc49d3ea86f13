"""Session memory: durable notes extracted in the background and offered to later calls.

Three pieces:

- :class:`MemoryCounters`, one per session: the growth since the last extraction (tokens,
  tool calls, turns) and the extraction state machine; the only mutable thing here.
- an :class:`~tinyctx.middleware.extractors.Extractor` that turns conversation into note
  texts (:class:`~tinyctx.middleware.extractors.RuleExtractor` by default).
- :class:`SessionMemory`, the layer: it feeds the counters, starts an extraction in the
  session's task group when they say so, writes the notes to a :class:`~tinyctx.stores.Store`
  and offers stored notes to later model calls.

**Extraction.** At the end of a run that produced a result, the layer ticks a turn and,
when ``should_extract()``, starts the extraction with ``ctx.spawn``: the run returns
without waiting. A run whose thresholds are met while an extraction is in progress queues
one (``session_memory.queued``; several such runs queue one, over the newest history): it
starts in the same background task as soon as the running one ends, so the last facts of
a session are extracted too, and leaving the session waits for the queue within its grace
period. A queue cut off by the grace period stays pending (:meth:`SessionMemory.pending`).
The extractor gets a child context of the run (tag
``session_memory.extraction``, its own empty conversation, linked cancellation, and the
filtered context view the run's model calls had at this layer, so a field an enclosing
``Inherit`` policy excluded never reaches it: place ``Inherit`` outside this layer) and
every message committed since the last extraction, as it was committed: a tool result
Microcompact cleared, or a head Summarize or a budget relief replaced, reaches the
extractor with its original content (the layer reads them through a
:class:`~tinyctx.MessageTap` on the conversation, and its thread state keeps what is still
unread for a later session: see ``middleware/_unread.py``). Its bullets are de-duplicated
against the newest
``scan_notes`` stored notes and written in one atomic batch (shielded from cancellation once
started, so a note batch is all written or not at all). An extractor that raises, or is
cancelled when the session ends after its grace period, fails the extraction: nothing is
written and the deltas stay. The batch is fenced by the session's thread lease
(``ctx.thread_lease()``): a worker that lost its thread to another (frozen past its lease)
gets ``FencedOut``, reported as ``.failed``, and writes nothing; the new owner extracts those
messages once. A run that ends interrupted ticks nothing (its resumption will).

**Namespaces.** Notes of a run go to ``"{prefix}:thread:{thread_id}"`` (``scope="thread"``,
the default) or ``"{prefix}:user:{user_id}"`` (``scope="user"``; a run without a user id
falls back to its thread). ``namespace=`` takes a function of the ``RunConfig`` for any
other scheme (returning None skips memory for that run).

**Injection.** With ``inject=True`` the newest ``scan_notes`` notes of the run's namespace
are loaded when a run starts and offered to every model call of the run as a section
appended to the system prompt: newest first, greedily (a note too big for what is left is
skipped, an older shorter one may still fit), the whole section at most
``inject_max_tokens`` by ``counter``. The request is rewritten for the call only; the
conversation is never changed. Notes written during a run are offered from the next run
on (a stable system prompt within a run keeps the provider's prompt cache warm), including
in a new session of the same thread (or user).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
import attrs

from tinyctx import (
    Interrupted,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    RunResult,
    ToolCall,
    ToolError,
    ToolResult,
)
from tinyctx.chain import ToolCallHandler
from tinyctx.config import (
    flag,
    one_of,
    owned_by,
    text,
)
from tinyctx.conversation import Conversation
from tinyctx.ordering import Inside, Once
from tinyctx.reexport import publish
from tinyctx.stores import Note, Store, append_notes
from tinyctx.tokens import TokenCounter, default_counter

from . import _memory_counters, _memory_events, _memory_state
from ._memory_counters import (
    Counts,
    ExtractionStateError,
    ExtractionTicket,
    MemoryCounters,
    MemoryThresholds,
)
from ._memory_events import (
    MemoryExtractionCompleted,
    MemoryExtractionFailed,
    MemoryExtractionQueued,
    MemoryExtractionSkipped,
    MemoryExtractionStarted,
    MemoryLoaded,
    MemoryLoadFailed,
    MemoryToggled,
)
from ._memory_state import (
    _COUNTER,
    _EXTRACTOR,
    _NAMESPACE,
    _POSITIVE,
    _STORE,
    SECTION_HEADER,
    MemorySection,
    _error_text,
    _MemoryState,
    _Queued,
    _Source,
)
from .context_view import VIEW_GLOBAL_KEY, VIEW_KEY, VIEW_STEP_KEY
from .extractors import (
    ExtractionJob,
    Extractor,
    RuleExtractor,
    check_bullets,
    dedupe_bullets,
)
from .inheritance import Inherit

publish(__name__, _memory_counters, _memory_events, _memory_state)

__all__ = [
    "SessionMemory",
    "MemoryCounters",
    "MemoryThresholds",
    "Counts",
    "ExtractionTicket",
    "ExtractionStateError",
    "MemorySection",
    "EXTRACTION_TAG",
    "MemoryExtractionStarted",
    "MemoryExtractionCompleted",
    "MemoryExtractionFailed",
    "MemoryExtractionSkipped",
    "MemoryExtractionQueued",
    "MemoryLoaded",
    "MemoryLoadFailed",
    "MemoryToggled",
]

VIEW_CARRIERS = (VIEW_KEY, VIEW_GLOBAL_KEY, VIEW_STEP_KEY)
"""``configurable`` keys of a materialized context view (raw tiers shadowed) that an
extraction takes over from the run's model calls."""

EXTRACTION_TAG = "session_memory.extraction"
"""Tag of an extraction's context; the layer neither counts nor injects in such calls."""

Scope = Literal["thread", "user"]


class SessionMemory(Layer):
    """Extract durable notes in the background and offer them to later calls (see the
    module docstring for counters, namespaces and injection).

    Args:
        extractor: Turns conversation into notes; default an offline :class:`RuleExtractor`.
        store: A :class:`Store` or the name of one in ``ctx.stores`` (checked at run start).
        min_tokens: Conversation growth in tokens that an extraction waits for.
        min_tool_calls: Finished tool calls that an extraction waits for.
        min_turns: Finished runs that an extraction waits for.
        enabled: False turns off counting and extraction (not injection: see ``inject``).
        inject: Offer the stored notes to every model call as a system-prompt section.
        inject_max_tokens: The most the offered section takes, by ``counter``.
        scan_notes: How many of the newest notes are offered and de-duplicated against.
        scope: ``"thread"`` or ``"user"``: whose notes a run reads and writes.
        namespace: A function (RunConfig) -> namespace, None for no memory in that run.
        prefix: The first part of every namespace.
        counter: Counts the offered section; default :func:`~tinyctx.tokens.default_counter`.
        name: The key of the layer's state; default the class name.
    """

    constraints = (
        Once(reason="two would extract the same conversation twice into one store"),
        Inside(
            Inherit,
            reason="extraction runs under the context view this layer sees; outside Inherit "
            "it would see fields Inherit's policy excludes",
        ),
    )

    def __init__(
        self,
        extractor: Extractor | None = None,
        *,
        store: Store | str = "memory",
        min_tokens: int = 4000,
        min_tool_calls: int = 8,
        min_turns: int = 4,
        enabled: bool = True,
        inject: bool = True,
        inject_max_tokens: int = 800,
        scan_notes: int = 200,
        scope: Scope = "thread",
        namespace: Callable[[RunConfig], str | None] | None = None,
        prefix: str = "session_memory",
        counter: TokenCounter | None = None,
        name: str | None = None,
    ) -> None:
        if extractor is None:
            extractor = RuleExtractor()
        _EXTRACTOR.check(extractor, "extractor", "SessionMemory")
        _STORE.check(store, "store", "SessionMemory")
        flag().check(enabled, "enabled", "SessionMemory")
        flag().check(inject, "inject", "SessionMemory")
        one_of(("thread", "user")).check(scope, "scope", "SessionMemory")
        _NAMESPACE.check(namespace, "namespace", "SessionMemory")
        text().check(prefix, "prefix", "SessionMemory")
        _COUNTER.check(counter, "counter", "SessionMemory")
        self.extractor: Extractor = extractor
        self.store = store
        with owned_by("SessionMemory"):
            self.thresholds = MemoryThresholds(min_tokens, min_tool_calls, min_turns)
        self.enabled = enabled
        self.inject = inject
        self.inject_max_tokens = _POSITIVE.check(
            inject_max_tokens, "inject_max_tokens", "SessionMemory"
        )
        self.scan_notes = _POSITIVE.check(scan_notes, "scan_notes", "SessionMemory")
        self.scope: Scope = scope
        self.prefix = prefix
        self.counter: TokenCounter = counter if counter is not None else default_counter()
        self._namespace = namespace
        if name is not None:
            self.name = name

    # -- per-session state and lookups -------------------------------------------------

    def _new_state(self) -> _MemoryState:
        return _MemoryState(MemoryCounters(self.thresholds, enabled=self.enabled))

    def _restore_state(self, data: Any) -> _MemoryState:
        return _MemoryState.from_json(data, self.thresholds)

    def _state(self, ctx: RunContext[Any]) -> _MemoryState:
        state = ctx.thread_state(self, self._new_state, self._restore_state)
        unread = state.unread
        if state.counters.enabled:
            if not unread.is_open:
                # from here every committed message is recorded as committed; what came
                # before and no extraction read yet is the backlog
                unread.open(ctx.conversation, state.since(ctx.conversation.messages))
        elif unread.is_open:  # disabled: no bookkeeping at all
            unread.close()
        return state

    def counters(self, ctx: RunContext[Any]) -> MemoryCounters:
        """This session's counters (``ctx`` is the session's or any of its runs')."""
        return self._state(ctx).counters

    def section(self, ctx: RunContext[Any]) -> MemorySection | None:
        """The section this session currently offers to model calls, if any."""
        return self._state(ctx).section

    def disable(self, ctx: RunContext[Any]) -> None:
        """Stop counting and extracting in this session."""
        counters = self.counters(ctx)
        if counters.enabled:
            counters.disable()
            ctx.emit(MemoryToggled(enabled=False))

    def enable(self, ctx: RunContext[Any]) -> None:
        """Resume counting and extracting in this session."""
        counters = self.counters(ctx)
        if not counters.enabled:
            counters.enable()
            ctx.emit(MemoryToggled(enabled=True))

    def namespace_for(self, config: RunConfig) -> str | None:
        """The notes namespace of a run (see the module docstring)."""
        if self._namespace is not None:
            return self._namespace(config)
        if self.scope == "user" and config.user_id is not None:
            return f"{self.prefix}:user:{config.user_id}"
        return f"{self.prefix}:thread:{config.thread_id}"

    def store_for(self, ctx: RunContext[Any]) -> Store:
        """The store given, or the one named in ``ctx.stores`` (KeyError names the known)."""
        store = self.store
        return ctx.stores[store] if isinstance(store, str) else store

    def render(self, notes: Sequence[Note]) -> MemorySection | None:
        """The section for ``notes`` (oldest first, as stores return them): newest first,
        greedy, at most ``inject_max_tokens``; None when no note fits."""
        count = self.counter.count_text
        budget = self.inject_max_tokens
        used = count(SECTION_HEADER)
        chosen: list[Note] = []
        for note in reversed(notes):
            cost = count(f"\n- {note.text}")
            if used + cost <= budget:
                chosen.append(note)
                used += cost
        while chosen:
            text = SECTION_HEADER + "".join(f"\n- {note.text}" for note in chosen)
            tokens = count(text)
            if tokens <= budget:  # per-piece rounding may differ from the whole: verify
                return MemorySection(text, tuple(chosen), tokens)
            chosen.pop()
        return None

    # -- hooks ---------------------------------------------------------------------------

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        if EXTRACTION_TAG in ctx.tags:
            return
        store = self.store_for(ctx)  # a misnamed store fails the run now, not at its end
        if not self.inject:
            return
        state = self._state(ctx)
        namespace = self.namespace_for(ctx.config)
        if namespace is None:
            state.section = None
            return
        try:
            notes = await store.notes(namespace, limit=self.scan_notes)
        except Exception as exc:
            # memory is advice: the run goes on with what was offered before
            ctx.emit(MemoryLoadFailed(namespace=namespace, error=_error_text(exc)))
            return
        section = self.render(notes)
        state.section = section
        ctx.emit(
            MemoryLoaded(
                namespace=namespace,
                notes=len(notes),
                injected=len(section.notes) if section else 0,
                tokens=section.tokens if section else 0,
            )
        )

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if EXTRACTION_TAG in ctx.tags:
            return await call_next(request, ctx)
        state = self._state(ctx)
        configurable = ctx.config.configurable
        if VIEW_KEY in configurable:
            run = ctx.config.agent_run_id or ctx.run_id
            if state.view is None or state.view[0] != run:
                carried = {k: configurable[k] for k in VIEW_CARRIERS if k in configurable}
                state.view = (run, carried)
        section = state.section
        if section is not None:
            system = request.system_prompt
            text = f"{system}\n\n{section.text}" if system else section.text
            request = request.evolve(system_prompt=text)
        response = await call_next(request, ctx)
        usage = response.usage
        if usage is not None:
            state.counters.record_usage(usage.input_tokens + usage.output_tokens)
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        try:
            result = await call_next(call, ctx)
        except ToolError:
            # a failed call is a tool call too (the model reads its error)
            if EXTRACTION_TAG not in ctx.tags:
                self._state(ctx).counters.record_tool_calls(1)
            raise
        if EXTRACTION_TAG not in ctx.tags:
            self._state(ctx).counters.record_tool_calls(1)
        return result

    async def on_run_end(
        self, ctx: RunContext[Any], result: RunResult | None, error: BaseException | None
    ) -> None:
        if EXTRACTION_TAG in ctx.tags:
            return
        state = self._state(ctx)
        # what is unread now becomes the durable record (not at every step: see _unread)
        state.unread.snapshot(ctx.conversation)
        counters = state.counters
        if not counters.enabled or isinstance(error, Interrupted):
            return
        counters.tick_turn()
        if result is None:
            ctx.emit(MemoryExtractionSkipped(reason="run_failed", detail=_error_text(error)))
            return
        namespace = self.namespace_for(ctx.config)
        if namespace is None:
            ctx.emit(MemoryExtractionSkipped(reason="no_namespace", detail=counters.describe()))
            return
        unmet = counters.unmet()
        if unmet and not state.pending:  # pending work of an earlier session runs anyway
            ctx.emit(
                MemoryExtractionSkipped(
                    reason="thresholds", unmet=unmet, detail=counters.describe()
                )
            )
            return
        running = counters.ticket
        if running is not None:
            child = self._child(ctx, namespace)
            if child is None:
                return
            messages = ctx.conversation.messages
            state.queued = _Queued(child, messages, namespace, self.store_for(ctx))
            ctx.emit(
                MemoryExtractionQueued(
                    namespace=namespace,
                    behind=running.number,
                    messages=len(messages) - state.since(messages),
                )
            )
            return
        self._start(ctx, state, self.store_for(ctx), namespace)

    # -- extraction ----------------------------------------------------------------------

    def pending(self, ctx: RunContext[Any]) -> bool:
        """Whether an extraction of this thread is due and has not run: queued behind the
        one in progress, or cut off when its session ended (a later session of the thread
        runs it at its next run end)."""
        state = self._state(ctx)
        return state.queued is not None or state.pending

    def _child(self, ctx: RunContext[Any], namespace: str) -> RunContext[Any] | None:
        """The context an extraction of ``ctx``'s run runs under (None, reported, when
        there is no room for one, e.g. a run already at max_depth)."""
        view = self._state(ctx).view
        run = ctx.config.agent_run_id or ctx.run_id
        carried = view[1] if view is not None and view[0] == run else None
        try:
            return ctx.derive(
                tags=(EXTRACTION_TAG,), conversation=Conversation(), configurable=carried
            )
        except Exception as exc:
            ctx.emit(MemoryExtractionFailed(namespace=namespace, error=_error_text(exc)))
            return None

    def _begin(
        self,
        child: RunContext[Any],
        state: _MemoryState,
        messages: tuple[Message, ...],
        namespace: str,
    ) -> tuple[ExtractionTicket, ExtractionJob]:
        counters = state.counters
        read, fresh = state.reading(messages)
        job = ExtractionJob(read, since=len(read) - fresh, namespace=namespace)
        deltas = counters.deltas()
        ticket = counters.begin()
        state.pending = False  # in progress now; written as pending until it completes
        child.emit(
            MemoryExtractionStarted(
                namespace=namespace,
                extraction=ticket.number,
                tokens=deltas.tokens,
                tool_calls=deltas.tool_calls,
                turns=deltas.turns,
                messages=len(job.new_messages),
            )
        )
        return ticket, job

    def _start(
        self, ctx: RunContext[Any], state: _MemoryState, store: Store, namespace: str
    ) -> None:
        child = self._child(ctx, namespace)
        if child is None:
            return
        state.queued = None  # one left by an ended session: this extraction covers it
        conversation = ctx.conversation
        ticket, job = self._begin(child, state, conversation.messages, namespace)
        source = (conversation, state.unread.tap)
        try:
            ctx.spawn(
                self._extract_all,
                child,
                state,
                store,
                ticket,
                (job, source),
                name=f"{self.name}.extract",
            )
        except Exception as exc:
            state.counters.fail(ticket)
            child.emit(
                MemoryExtractionFailed(
                    namespace=namespace, extraction=ticket.number, error=_error_text(exc)
                )
            )

    async def _extract_all(
        self,
        ctx: RunContext[Any],
        state: _MemoryState,
        store: Store,
        ticket: ExtractionTicket,
        work: tuple[ExtractionJob, _Source],
    ) -> None:
        """Extract, then whatever was queued meanwhile, in this same background task (so
        leaving the session waits for the queue within its grace period). A queued
        extraction reads everything committed up to when it starts."""
        job, (conversation, _) = work
        while True:
            await self._extract(ctx, state, store, ticket, work)
            queued = state.queued
            if queued is None or not state.counters.enabled:
                return
            state.queued = None
            ctx, store = queued.ctx, queued.store
            ticket, job = self._begin(ctx, state, conversation.messages, queued.namespace)
            work = (job, (conversation, state.unread.tap))

    def _note_metadata(self, ctx: RunContext[Any]) -> dict[str, Any]:
        config = ctx.config
        meta: dict[str, Any] = {
            "source": "session_memory",
            "extractor": str(getattr(self.extractor, "name", type(self.extractor).__name__)),
            "thread_id": config.thread_id,
            "run_id": config.parent_run_id,
        }
        if config.user_id is not None:
            meta["user_id"] = config.user_id
        return meta

    async def _extract(
        self,
        ctx: RunContext[Any],
        state: _MemoryState,
        store: Store,
        ticket: ExtractionTicket,
        work: tuple[ExtractionJob, _Source],
    ) -> None:
        job, (conversation, tap) = work
        counters = state.counters
        started = time.perf_counter()
        try:
            existing = await store.notes(job.namespace, limit=self.scan_notes)
            job = attrs.evolve(job, existing=existing)
            proposed = check_bullets(await self.extractor.extract(job, ctx), self.extractor)
            fresh = dedupe_bullets(proposed, job.existing_texts)
            # once the write starts it finishes: a batch is all written or not at all, and
            # only while this session still holds its thread's lease (a worker that lost
            # the thread gets FencedOut: the new owner extracts these messages instead)
            with anyio.CancelScope(shield=True):
                written = await append_notes(
                    store,
                    job.namespace,
                    fresh,
                    metadata=self._note_metadata(ctx),
                    fence=ctx.thread_lease(store),
                )
        except BaseException as exc:
            counters.fail(ticket)
            cancelled = isinstance(exc, (RunCancelled, anyio.get_cancelled_exc_class()))
            if cancelled:
                state.pending = True  # the session ended first: the next one extracts it
            ctx.emit(
                MemoryExtractionFailed(
                    namespace=job.namespace,
                    extraction=ticket.number,
                    error=_error_text(exc),
                    cancelled=cancelled,
                    seconds=time.perf_counter() - started,
                )
            )
            if isinstance(exc, Exception):
                return  # reported above; not a BackgroundTaskFailed as well
            raise
        counters.complete(ticket)
        if tap is not None and state.unread.tap is tap:
            # read; what came meanwhile is the next one's
            state.unread.drop(len(job.new_messages))
            state.advance(conversation.messages, state.unread.in_history())
            state.unread.snapshot(conversation)
        else:  # disabled while it ran: no bookkeeping goes on
            state.advance(conversation.messages)
        ctx.emit(
            MemoryExtractionCompleted(
                namespace=job.namespace,
                extraction=ticket.number,
                notes_written=len(written),
                proposed=len(proposed),
                duplicates=len(proposed) - len(fresh),
                seqs=tuple(note.seq for note in written),
                seconds=time.perf_counter() - started,
            )
        )
