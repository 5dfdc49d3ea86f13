"""Inheritance: every model call, tool call and sub-agent runs under a derived context.

:class:`Inherit` derives a child context (``ctx.derive``) for each model call and each tool
call, with the layer's local tags and metadata, so whatever happens inside (inner layers,
the model handler, the tool, events) carries its own run id and the parent chain. With a
view (the default) it also materializes the :class:`~tinyctx.middleware.context_view.
ContextView` once per call and hands the same object to both carriers.

:func:`run_subagent` runs a nested agent under a derived context with its own conversation.
The sub-agent inherits the ids (root, parent, thread), tags, metadata, configurable values
(the context view among them), stores, event sink, usage and cost trackers (its tokens roll
up to the root), cache, limits and depth; its cancellation token is linked (cancelling the
parent cancels it, not the reverse). What its outcomes do to the parent:

* **completed**: its final text is the result.
* **StopWithFinal** inside the sub-agent stops the sub-agent only; its final text is the
  result (``propagate_stop=True`` also requests the stop on the parent's slot).
* **Interrupt** inside the sub-agent pauses the sub-agent. With ``suspend=True`` (what
  :func:`subagent_tool` passes) the tool call running it is suspended
  (:class:`~tinyctx.Suspend`): the parent pauses *at that call*, with the sub-agent's node
  (``"<name>/<node>"``), message and payload (a review card, as is) and the sub-agent's
  checkpoint in the parent's run state, so the pause is stored with the parent's
  checkpoint. The parent's ``resume(decisions=...)`` (in any process) checks the decisions
  against the sub-agent's layers first, then runs the call again, which resumes the
  sub-agent with them; its answer is the call's result. Without ``suspend`` the same
  Interrupt is requested on the parent's control slot, so the parent pauses at its next
  safe point after the call returned a note, and the sub-agent's checkpoint is on the
  result (``resume=`` continues it; the parent's resume does not).
* **RunCancelled**: when the parent's token is cancelled the whole tree stops and the error
  propagates; a cancellation local to the sub-agent ends only the sub-agent (status
  ``"cancelled"``).
* Any other error propagates (a tool running a sub-agent turns it into an error result).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from attrs import field, frozen

from tinyctx import (
    Agent,
    ConfigError,
    Event,
    Interrupt,
    Interrupted,
    InvalidCheckpoint,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunContext,
    RunResult,
    Session,
    StopWithFinal,
    Suspend,
    Tool,
    ToolCall,
    ToolResult,
)
from tinyctx.agent import Checkpoint
from tinyctx.chain import ToolCallHandler
from tinyctx.codec import CodecError, decode_checkpoint, encode_checkpoint
from tinyctx.config import implements, text
from tinyctx.control import in_tool_call, resumption
from tinyctx.conversation import Conversation
from tinyctx.decisions import Decision
from tinyctx.events import EventLevel
from tinyctx.frozen import FrozenDict, freeze, thaw
from tinyctx.steps import subagent_steps
from tinyctx.tools import ToolRegistry

from .context_view import ContextPolicy, ContextViewBuilt, ViewSpec

__all__ = [
    "Inherit",
    "run_subagent",
    "check_subagent_resume",
    "subagent_tool",
    "SubagentResult",
    "SubagentStatus",
    "SubagentFinished",
    "SubagentTool",
]

SubagentStatus = Literal["completed", "stopped", "interrupted", "cancelled"]


def _tags(value: Iterable[str], owner: str) -> tuple[str, ...]:
    tags = (value,) if isinstance(value, str) else tuple(value)
    for tag in tags:
        if not _TAG.test(tag):
            raise ConfigError("tags", value, "an iterable of non-empty strings", owner=owner)
    return tags


_TAG = text()
_METADATA = implements(Mapping, allowed="a mapping or None")


def _metadata(value: Mapping[str, Any] | None, owner: str) -> FrozenDict[str, Any]:
    if value is None:
        return FrozenDict()
    _METADATA.check(value, "metadata", owner)
    frozen_value: FrozenDict[str, Any] = freeze(value) if value else FrozenDict()
    return frozen_value


def _view_spec(view: bool | ContextPolicy | ViewSpec | None) -> ViewSpec | None:
    if view is True:
        return ViewSpec()
    if view is False or view is None:
        return None
    if isinstance(view, ContextPolicy):
        return ViewSpec(policy=view)
    if isinstance(view, ViewSpec):
        return view
    raise ConfigError("view", view, "True, False, a ContextPolicy or a ViewSpec", owner="Inherit")


class Inherit(Layer):
    """Run each model call and each tool call under ``ctx.derive(tags, metadata)``.

    ``view`` (default True: pass-all policy, header on) materializes the context view once
    per call: the request carries it in ``metadata`` and a system-prompt header, and the
    derived context carries it for inner layers, the model handler, tools and sub-agents.
    Pass a :class:`ContextPolicy` or a :class:`ViewSpec` to filter or configure it, False
    for none.
    """

    def __init__(
        self,
        tags: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
        view: bool | ContextPolicy | ViewSpec | None = True,
        *,
        name: str | None = None,
    ) -> None:
        self.tags = _tags(tags, "Inherit")
        self.metadata = _metadata(metadata, "Inherit")
        # what each call's derive gets: None when there is nothing to merge (no look per call)
        self._call_metadata = self.metadata or None
        self.view = _view_spec(view)
        if name is not None:
            self.name = name

    def _child(
        self, ctx: RunContext[Any], request: ModelRequest | None
    ) -> tuple[RunContext[Any], ModelRequest | None]:
        """The call's derived context, and the request carrying the view (model calls)."""
        spec = self.view
        metadata = self._call_metadata
        if spec is None:
            return ctx.derive(tags=self.tags, metadata=metadata), request
        built, fresh, request = spec.for_call(ctx, request)
        child = ctx.derive(tags=self.tags, metadata=metadata, configurable=built.configurable)
        if fresh:
            child.emit(ContextViewBuilt(fields=built.fields, excluded=built.excluded))
        return child, request

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        child, carried = self._child(ctx, request)
        assert carried is not None
        return await call_next(carried, child)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        child, _ = self._child(ctx, None)
        return await call_next(call, child)

    def on_checkpoint(self, checkpoint: Checkpoint, ctx: RunContext[Any]) -> Checkpoint:
        """A paused run's checkpoint keeps no path this layer's policy excludes.

        The run's raw view tiers are redacted (the resumed run rebuilds the same view from
        what is left), so a stored or transferred checkpoint never carries a hidden field.
        """
        spec = self.view
        if spec is None:
            return checkpoint
        config = checkpoint.run_config
        configurable = spec.redact_configurable(config.configurable)
        if configurable == config.configurable:
            return checkpoint
        return checkpoint.evolve(run_config=config.evolve(configurable=configurable))


# ---------------------------------------------------------------------------------------
# sub-agents


@frozen
class SubagentResult:
    """What a sub-agent run produced, as seen by its parent."""

    status: SubagentStatus
    text: str
    run_id: str | None = None
    result: RunResult | None = None
    checkpoint: Checkpoint | None = None
    """The sub-agent's own checkpoint when it was interrupted (``run_subagent(resume=...)``)."""


@frozen
class SubagentFinished(Event):
    """A sub-agent run ended (emitted in the parent's context; the child's run id inside)."""

    kind: ClassVar[str] = "subagent.finished"
    level: ClassVar[EventLevel] = "info"
    agent: str = ""
    child_run_id: str | None = None
    status: str = ""
    model_calls: int = 0
    tool_calls: int = 0


_UNSET: Any = object()


def _child_tools(agent: Agent, parent: RunContext[Any], inherit: bool) -> ToolRegistry:
    if not inherit:
        return ToolRegistry()
    own = {tool.name for tool in agent.tools}
    own_server = {tool.type for tool in agent.server_tools}
    return ToolRegistry(
        [tool for tool in parent.tools if tool.name not in own],
        [tool for tool in parent.tools.server_tools if tool.type not in own_server],
    )


async def run_subagent(
    agent: Agent,
    input: str | Message | Sequence[Message] | None,
    ctx: RunContext[Any],
    *,
    name: str | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    thread_id: str | None = None,
    data: Any = _UNSET,
    inherit_tools: bool = False,
    propagate_stop: bool = False,
    resume: Checkpoint | None = None,
    decisions: Mapping[str, Decision] | None = None,
    suspend: bool = False,
    grace_period: float = 5.0,
) -> SubagentResult:
    """Run ``agent`` nested under ``ctx`` with its own conversation; see the module doc.

    The sub-agent's events carry the tag ``subagent:<name>`` (``name`` defaults to
    ``agent.name``) and its metadata ``{"subagent": name}``, besides ``tags``/``metadata``.
    With ``inherit_tools`` it may also call the parent run's tools (its own win on a name
    clash); by default it sees only its own. ``resume`` continues the sub-agent's paused
    run from its checkpoint, with ``decisions`` for its layers. With ``suspend`` (inside a
    tool call) a pause of the sub-agent suspends the call, and the call's run after the
    parent's resume continues the sub-agent (see the module doc); a tool of your own that
    does this checks a resume's decisions with :func:`check_subagent_resume`.
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"run_subagent needs an Agent, got {type(agent).__name__}")
    label = name or agent.name
    if suspend and not in_tool_call():
        raise TypeError(
            "run_subagent(suspend=True) suspends the tool call it runs in, and there is none: "
            "call it from a tool's handler, or leave suspend=False"
        )
    ctx.cancellation.raise_if_cancelled("subagent")
    child = _child_context(
        agent,
        ctx,
        label,
        tags=tags,
        metadata=metadata,
        thread_id=thread_id,
        data=data,
        inherit_tools=inherit_tools,
    )
    if suspend and resume is None:
        resume, decisions = _suspended_subagent(label, decisions, child)
    try:
        # in a durable workflow the sub-agent's calls are its steps (tinyctx.steps)
        with subagent_steps(agent, label) as nested:
            async with Session(nested, ctx=child, grace_period=grace_period) as session:
                if resume is not None:
                    result = await session.resume(resume, decisions=decisions)
                else:
                    result = await session.run(input)
    except Interrupted as paused:
        return _paused_result(paused, ctx, label, suspend)
    except RunCancelled as cancelled:
        if ctx.cancellation.is_cancelled():
            raise
        ctx.emit(SubagentFinished(agent=label, status="cancelled"))
        reason = f": {cancelled.reason}" if cancelled.reason else ""
        return SubagentResult("cancelled", f"[sub-agent {label!r} was cancelled{reason}]")
    return _finished_result(result, ctx, label, propagate_stop)


def _paused_result(
    paused: Interrupted, ctx: RunContext[Any], label: str, suspend: bool
) -> SubagentResult:
    """What an Interrupt inside the sub-agent does to the parent: with ``suspend`` the
    call running it is suspended (raises :class:`~tinyctx.Suspend`), else the parent is
    asked to pause at its next safe point and the child's checkpoint is on the result."""
    pause = paused.checkpoint
    ctx.emit(
        SubagentFinished(
            agent=label,
            child_run_id=pause.run_id,
            status="interrupted",
            model_calls=pause.model_calls,
            tool_calls=pause.tool_calls,
        )
    )
    if suspend:
        # the call running the sub-agent stays open; the parent's resume runs it again.
        # The sub-agent's configurable is what it inherits from the parent's call, so
        # the pause keeps none: the resume inherits it again (values a store could not
        # keep, or a view's hidden fields, are never written)
        pause = pause.evolve(run_config=pause.run_config.evolve(configurable=FrozenDict()))
        raise Suspend(
            f"{label}/{paused.node}",
            paused.message,
            payload=pause.payload,
            state={"subagent": label, "checkpoint": encode_checkpoint(pause)},
        ) from None
    # the parent pauses at its next safe point; the child's checkpoint stays resumable
    ctx.request_control(Interrupt(paused.node, paused.message, pause.payload))
    detail = f"{paused.node}: {paused.message}" if paused.message else paused.node
    return SubagentResult(
        "interrupted",
        f"[sub-agent {label!r} paused at {detail}]",
        run_id=pause.run_id,
        checkpoint=pause,
    )


def _finished_result(
    result: RunResult, ctx: RunContext[Any], label: str, propagate_stop: bool
) -> SubagentResult:
    """A sub-agent run that ended (completed or stopped), reported to the parent."""
    if result.status == "stopped" and propagate_stop:
        ctx.request_control(StopWithFinal(result.final_text))
    ctx.emit(
        SubagentFinished(
            agent=label,
            child_run_id=result.run_id,
            status=result.status,
            model_calls=result.model_calls,
            tool_calls=result.tool_calls,
        )
    )
    return SubagentResult(result.status, result.final_text, run_id=result.run_id, result=result)


_CHILD_OPTIONS: frozenset[str] = frozenset(
    {"tags", "metadata", "thread_id", "data", "inherit_tools"}
)
"""The options of :func:`run_subagent` that shape the sub-agent's context."""


def _child_context(
    agent: Agent,
    ctx: RunContext[Any],
    label: str,
    *,
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    thread_id: str | None = None,
    data: Any = _UNSET,
    inherit_tools: bool = False,
) -> RunContext[Any]:
    derive_options: dict[str, Any] = {} if data is _UNSET else {"data": data}
    return ctx.derive(
        thread_id=thread_id,
        tags=(f"subagent:{label}", *_tags(tags, "run_subagent")),
        metadata={"subagent": label, **_metadata(metadata, "run_subagent")},
        conversation=Conversation(),
        tools=_child_tools(agent, ctx, inherit_tools),
        **derive_options,
    )


def _paused_subagent(label: str, state: Any, child: RunContext[Any]) -> Checkpoint:
    """The sub-agent checkpoint a suspended call kept in ``state``, with the configurable
    the sub-agent inherits again (``child``'s)."""
    if not isinstance(state, Mapping) or state.get("subagent") != label:
        raise InvalidCheckpoint(
            f"the suspended call's state is not a pause of sub-agent {label!r}: {thaw(state)!r}"
        )
    document = state.get("checkpoint")
    if not isinstance(document, str):
        raise InvalidCheckpoint(f"the pause of sub-agent {label!r} keeps no checkpoint")
    try:
        checkpoint = decode_checkpoint(document)
    except CodecError as exc:
        raise InvalidCheckpoint(f"the checkpoint of sub-agent {label!r}: {exc}") from exc
    config = checkpoint.run_config.evolve(configurable=child.config.configurable)
    return checkpoint.evolve(run_config=config)


def _suspended_subagent(
    label: str, decisions: Mapping[str, Decision] | None, child: RunContext[Any]
) -> tuple[Checkpoint | None, Mapping[str, Decision] | None]:
    """The sub-agent pause this call resumes, with the parent's resume's decisions, if the
    run is resuming the call (see :func:`tinyctx.control.resumption`)."""
    resumed = resumption()
    if resumed is None:
        return None, decisions
    return _paused_subagent(label, resumed.state, child), resumed.decisions


@frozen
class SubagentTool(Tool):
    """The tool :func:`subagent_tool` makes: it checks a resume's decisions against the
    paused sub-agent's layers before the parent's run goes on."""

    agent: Agent = field(kw_only=True, eq=False, repr=False)
    subagent_options: Mapping[str, Any] = field(kw_only=True, eq=False, repr=False)
    nested_steps: ClassVar[bool] = True
    """In a durable workflow the call runs in the workflow and the sub-agent's own calls
    are its steps (``tinyctx.subagent:<name>/...``), not the call as one step."""

    async def check_resume(
        self, state: Any, decisions: Mapping[str, Decision], ctx: RunContext[Any]
    ) -> None:
        shape = {k: v for k, v in self.subagent_options.items() if k in _CHILD_OPTIONS}
        await check_subagent_resume(self.agent, state, decisions, ctx, name=self.name, **shape)


async def check_subagent_resume(
    agent: Agent,
    state: Any,
    decisions: Mapping[str, Decision],
    ctx: RunContext[Any],
    *,
    name: str | None = None,
    **options: Any,
) -> None:
    """Raise :class:`~tinyctx.ResumeError` when ``decisions`` cannot resume the sub-agent
    pause a call suspended with (``state``, from :func:`run_subagent` with ``suspend``),
    before anything runs: the body of ``Tool.check_resume`` for a tool of your own that runs
    a sub-agent. Give the ``name`` and the options that shape the sub-agent's context
    (``tags``, ``metadata``, ``thread_id``, ``data``, ``inherit_tools``) the tool gives
    :func:`run_subagent`."""
    unknown = sorted(set(options) - _CHILD_OPTIONS)
    if unknown:
        raise TypeError(
            f"check_subagent_resume got {unknown}; it takes name= and {sorted(_CHILD_OPTIONS)}"
        )
    label = name or agent.name
    child = _child_context(agent, ctx, label, **options)
    checkpoint = _paused_subagent(label, state, child)
    async with Session(agent, ctx=child) as session:
        await session.check_resume(checkpoint, decisions=decisions)


def subagent_tool(
    agent: Agent,
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Any,
) -> Tool:
    """A tool ``name(task: str)`` that delegates ``task`` to ``agent`` with run_subagent.

    ``name`` (default ``agent.name``) names the tool and the sub-agent; ``options`` are
    passed to :func:`run_subagent`, with ``suspend=True`` unless given: a pause of the
    sub-agent (a review) pauses the parent at this call, and the parent's resume continues
    the sub-agent. The tool's result is the sub-agent's final text (or a bracketed note when
    it was cancelled locally, or paused with ``suspend=False``).
    """
    label = name or agent.name
    options.setdefault("suspend", True)
    for reserved in ("resume", "decisions"):
        if reserved in options:
            raise ConfigError(
                reserved, options[reserved], "not set (a resume brings them)", owner="subagent_tool"
            )

    async def delegate(arguments: Mapping[str, Any], ctx: RunContext[Any]) -> str:
        task = arguments.get("task")
        if not isinstance(task, str):
            raise TypeError("the 'task' argument must be a string")
        outcome = await run_subagent(agent, task, ctx, name=label, **options)
        return outcome.text

    return SubagentTool(
        label,
        description or f"Delegate a task to the {label!r} sub-agent and return its answer.",
        {
            "type": "object",
            "properties": {"task": {"type": "string", "description": "what to do"}},
            "required": ["task"],
            "additionalProperties": False,
        },
        handler=delegate,
        agent=agent,
        subagent_options=MappingProxyType(options),
    )
