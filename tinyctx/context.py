"""RunConfig and RunContext: what a run knows, and how nested calls inherit it.

Both are frozen. ``ctx.derive(...)`` returns a child for a nested call (a model call, a
tool, a sub-agent) and never mutates the parent: the child gets a fresh run id, points at
its parent, keeps the root and the thread, adds its own tags and metadata, and shares the
handles that belong to the whole tree (events, stores, usage, costs, cache). Its
cancellation token is linked: cancelling the parent cancels the child, not the reverse.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
from attrs import field, frozen

from . import config
from .cache import CacheRegistry
from .cancel import CancellationToken
from .config import Check, integer, text
from .control import Control, ControlSlot
from .conversation import Conversation
from .errors import ConfigError, DepthLimitExceeded
from .events import Event, EventSink
from .frozen import EMPTY, FrozenDict, clone_with, frozen_mapping
from .state import RunStates
from .store_protocols import Store, StoreRegistry
from .tasks import BackgroundTasks
from .threads import Lease
from .tool_types import Tool, ToolRegistry
from .usage import CostTracker, Price, UsageTracker

if TYPE_CHECKING:
    from .chain import LayerBus

__all__ = ["RunConfig", "RunContext", "new_run_id"]

Data = TypeVar("Data")
T = TypeVar("T")


RUN_ID_SOURCE: ContextVar[Callable[[], str] | None] = ContextVar(
    "tinyctx.run_id_source", default=None
)
"""Where run ids come from in this context (None: random). A durable engine sets it while
a workflow runs so the ids a replay makes are the ids the first execution made
(:func:`tinyctx.steps.run_ids_from`)."""


CLOCK_SOURCE: ContextVar[Callable[[], float] | None] = ContextVar(
    "tinyctx.clock_source", default=None
)
"""Where the times a thread keeps come from in this context (None: the wall clock). A
durable engine sets it while a workflow runs, so a replay writes what the first execution
wrote (:func:`tinyctx.steps.clock_from`)."""


REPLAY_SOURCE: ContextVar[Callable[[], bool] | None] = ContextVar(
    "tinyctx.replay_source", default=None
)
"""Whether the code running now replays recorded steps (None: never). A durable engine
sets it while a workflow runs; events emitted while it says True are stamped
``replayed=True`` (:func:`tinyctx.steps.replay_from`)."""


def wall_clock() -> float:
    """Seconds since the epoch, for times a thread keeps (usage records); inside a durable
    workflow, the engine's deterministic clock."""
    source = CLOCK_SOURCE.get()
    return source() if source is not None else time.time()


_IDS_AT_ONCE = 64
_spare_ids: list[str] = []
"""Random ids drawn ahead, 64 per ``os.urandom`` call (a system call each): the same
entropy per id. Emptied in a forked child, which must never hand out its parent's ids."""


def _forget_spare_ids() -> None:
    _spare_ids.clear()


os.register_at_fork(after_in_child=_forget_spare_ids)


def new_run_id() -> str:
    """128 random bits as 32 hex characters (uuid4's entropy at a fraction of its cost);
    inside a durable workflow, the workflow's next deterministic id."""
    source = RUN_ID_SOURCE.get()
    if source is not None:
        return source()
    try:
        return _spare_ids.pop()
    except IndexError:
        drawn = os.urandom(16 * _IDS_AT_ONCE).hex()
        _spare_ids.extend([drawn[at : at + 32] for at in range(32, len(drawn), 32)])
        return drawn[:32]


def _tags(value: Iterable[str]) -> tuple[str, ...]:
    tags = tuple(value)
    for tag in tags:
        if not _ID.test(tag):
            raise ConfigError("tags", value, "an iterable of non-empty strings", owner="RunConfig")
    # keep order, drop duplicates
    return tuple(dict.fromkeys(tags))


_LAST_MERGE: list[tuple[object, object, FrozenDict[str, Any]]] = [(None, None, EMPTY)]
"""The last ``derive(configurable=...)`` merge, as one tuple (swapped atomically)."""


def _merged_configurable(
    base: FrozenDict[str, Any], added: Mapping[str, Any]
) -> FrozenDict[str, Any]:
    """``base | added``; the same merged object again while both are the same frozen
    objects (a layer deriving every call with its own constant values: no copy per call)."""
    last = _LAST_MERGE[0]
    if last[0] is base and last[1] is added:
        return last[2]
    merged = base | frozen_mapping(added)
    if type(added) is FrozenDict:  # immutable: the same object means the same values
        _LAST_MERGE[0] = (base, added, merged)
    return merged


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return value if type(value) is tuple else tuple(value)


def _int_at_least(minimum: int, *, optional: bool = False) -> Check[Any]:
    return config.optional(integer(minimum)) if optional else integer(minimum)


_ID = text()
_id_string = _ID
_optional_id = config.optional(_ID)


@frozen(slots=False)  # dict-backed: derive() copies it with one dict update
class RunConfig:
    """Identity, labels, limits and the context window of one run.

    ``RunConfig()`` is a fresh root run: a new ``run_id`` that is also its ``root_run_id``.
    ``metadata`` and ``configurable`` are read-only mappings; nothing reached through a
    child can change them.
    """

    run_id: str = field(factory=new_run_id, validator=_id_string)
    thread_id: str = field(factory=new_run_id, validator=_id_string)
    parent_run_id: str | None = field(default=None, validator=_optional_id)
    root_run_id: str = field(validator=_id_string)
    lineage: tuple[str, ...] = field(default=(), converter=_str_tuple)
    """Ancestor run ids, root first, parent last (empty for a root run)."""
    user_id: str | None = field(default=None, validator=_optional_id)
    agent_run_id: str | None = field(default=None, validator=_optional_id)
    """The agent run (one ``Session.run``) this context belongs to: the run's own id in the
    run's context, kept by ``derive()`` for the calls nested in it; None outside any run."""
    tags: tuple[str, ...] = field(default=(), converter=_tags)
    metadata: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    configurable: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    depth: int = field(default=0, validator=_int_at_least(0))
    max_depth: int = field(default=16, validator=_int_at_least(0))
    max_model_calls: int | None = field(default=25, validator=_int_at_least(1, optional=True))
    max_tool_calls: int | None = field(default=None, validator=_int_at_least(1, optional=True))
    model: str | None = None
    max_tokens: int | None = field(default=None, validator=_int_at_least(1, optional=True))
    reserved_output_tokens: int = field(default=0, validator=_int_at_least(0))

    @root_run_id.default
    def _root_defaults_to_self(self) -> str:
        return self.run_id

    def __attrs_post_init__(self) -> None:
        lineage = self.lineage
        if lineage and (
            len(lineage) != self.depth
            or lineage[-1] != self.parent_run_id
            or lineage[0] != self.root_run_id
        ):
            raise ConfigError(
                "lineage",
                lineage,
                "ancestor run ids from root_run_id to parent_run_id, one per depth level",
                owner="RunConfig",
            )
        if self.depth > self.max_depth:
            raise DepthLimitExceeded(self.depth, self.max_depth)
        if self.depth == 0 and self.parent_run_id is not None:
            raise ConfigError(
                "parent_run_id",
                self.parent_run_id,
                "None for a root run (depth 0)",
                owner="RunConfig",
            )
        if self.max_tokens is not None and self.reserved_output_tokens >= self.max_tokens:
            raise ConfigError(
                "reserved_output_tokens",
                self.reserved_output_tokens,
                f"0 <= reserved_output_tokens < max_tokens ({self.max_tokens})",
                owner="RunConfig",
            )

    def evolve(self, **changes: Any) -> RunConfig:
        """A copy with ``changes``; every validator runs again."""
        return attrs.evolve(self, **changes)

    @property
    def usable_tokens(self) -> int | None:
        """``max_tokens - reserved_output_tokens``, or None when the window is unknown."""
        if self.max_tokens is None:
            return None
        return self.max_tokens - self.reserved_output_tokens


_UNSET: Any = object()


def _child_identity(parent: RunConfig) -> dict[str, Any]:
    """What every child config of ``parent`` has in common: its place in the tree."""
    depth = parent.depth + 1
    if depth > parent.max_depth:
        raise DepthLimitExceeded(depth, parent.max_depth)
    lineage = (*parent.lineage, parent.run_id) if parent.lineage or not parent.depth else ()
    return {"parent_run_id": parent.run_id, "lineage": lineage, "depth": depth}


_last_run_parent: tuple[RunConfig | None, dict[str, Any]] = (None, {})
"""The last config an agent run was derived from and its runs' config fields but the ids
(a session derives every run from the same config): one slot, replaced whole (threads
running loops of their own read a consistent pair), holding that config alive so that
the identity it is compared by stays its own."""


def _agent_run_config(parent: RunConfig) -> RunConfig:
    """The config of an agent run (``Session.run``) derived from ``parent``: a copy of
    the fields every such run shares, made once per parent, with a fresh run id."""
    global _last_run_parent
    last = _last_run_parent
    if last[0] is not parent:
        shared = parent.__dict__.copy()
        shared.update(_child_identity(parent))
        last = _last_run_parent = (parent, shared)
    state = last[1].copy()
    state["run_id"] = state["agent_run_id"] = new_run_id()
    config: RunConfig = object.__new__(RunConfig)
    object.__setattr__(config, "__dict__", state)
    return config


class _Named:
    """Stands in for an attrs Attribute when a validator is called by hand."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


@frozen(slots=False)  # dict-backed: derive() copies it with one dict update
class RunContext(Generic[Data]):
    """Everything a layer, a tool or a nested call can know about the current run.

    Frozen: layers change nothing here; the few mutable handles (conversation, trackers,
    control slot, cache) have their own narrow APIs and are shared by reference on purpose.
    """

    config: RunConfig
    data: Data
    stores: StoreRegistry = field(factory=StoreRegistry)
    events: EventSink = field(factory=EventSink)
    usage: UsageTracker = field(factory=UsageTracker)
    costs: CostTracker = field()
    cache: CacheRegistry = field(factory=CacheRegistry)
    cancellation: CancellationToken = field(factory=CancellationToken)
    control: ControlSlot = field(factory=ControlSlot)
    tools: ToolRegistry = field(factory=ToolRegistry)
    conversation: Conversation = field(factory=Conversation)
    background: BackgroundTasks | None = field(default=None, eq=False)
    bus: LayerBus | None = field(default=None, eq=False, repr=False)
    run_states: RunStates = field(factory=RunStates, eq=False, repr=False)
    """Per-run durable layer state of this session tree (see :meth:`run_state`)."""
    lease_source: Callable[[], Lease | None] | None = field(default=None, eq=False, repr=False)
    """Set by a Session with a store: its thread's current lease (see :meth:`thread_lease`)."""
    lease_store: object | None = field(default=None, eq=False, repr=False)
    """Set by a Session with a store: the store that holds that lease."""
    commit_source: Callable[[RunContext[Any]], Awaitable[None]] | None = field(
        default=None, eq=False, repr=False
    )
    """Set by a Session with a store: writes what its conversation committed (see
    :meth:`commit`)."""

    @costs.default
    def _costs_from_usage(self) -> CostTracker:
        return CostTracker(self.usage)

    # -- construction --------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        config: RunConfig | None = None,
        data: T = None,  # type: ignore[assignment]
        *,
        stores: Mapping[str, Store] | StoreRegistry | None = None,
        events: EventSink | None = None,
        prices: Mapping[str, Price] | None = None,
        cancellation: CancellationToken | None = None,
        tools: Iterable[Tool] = (),
        conversation: Conversation | None = None,
    ) -> RunContext[T]:
        """A root context with fresh handles (events, usage, costs, cache, control...)."""
        usage = UsageTracker()
        registry = stores if isinstance(stores, StoreRegistry) else StoreRegistry(stores)
        ctx: RunContext[T] = RunContext(
            config=config if config is not None else RunConfig(),
            data=data,
            stores=registry,
            events=events if events is not None else EventSink(),
            usage=usage,
            costs=CostTracker(usage, prices),
            cancellation=cancellation if cancellation is not None else CancellationToken(),
            tools=ToolRegistry(tools),
            conversation=conversation if conversation is not None else Conversation(),
        )
        # tools asking for what this context lacks (a store, app data) fail here
        ctx.tools.bind(ctx)
        return ctx

    def derive(
        self,
        *,
        thread_id: str | None = None,
        tags: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
        configurable: Mapping[str, Any] | None = None,
        data: Data = _UNSET,
        conversation: Conversation | None = None,
        tools: ToolRegistry | None = None,
    ) -> RunContext[Data]:
        """The context of a nested call; this context is never changed.

        The child adds tags and metadata (on a key clash its own value wins *in the child*);
        ``conversation`` gives a nested agent its own message log and ``tools`` its own tool
        registry (by default the child resolves tools from this context's registry).
        """
        parent = self.config
        changes: dict[str, Any] = {}
        if thread_id is not None:
            _id_string(None, _Named("thread_id"), thread_id)
            changes["thread_id"] = thread_id
        if tags:
            extra = tuple(t for t in _tags(tags) if t not in parent.tags)
            changes["tags"] = (*parent.tags, *extra)
        if metadata:
            changes["metadata"] = parent.metadata | frozen_mapping(metadata)
        if configurable:
            changes["configurable"] = _merged_configurable(parent.configurable, configurable)
        handles: dict[str, Any] = {
            "config": self._child_config(changes),
            "cancellation": self.cancellation.child(),
        }
        if data is not _UNSET:
            handles["data"] = data
        if conversation is not None:
            handles["conversation"] = conversation
        if tools is not None:
            handles["tools"] = tools
        return clone_with(self, handles)

    def _child_config(self, changes: dict[str, Any]) -> RunConfig:
        """The config of a nested call: ``changes`` (already validated) plus the new identity.

        Every value is either the (valid) parent's or validated by the caller, so the copy
        skips attrs' full re-validation: this runs once per nested call.
        """
        parent = self.config
        changes.update(_child_identity(parent))
        changes["run_id"] = new_run_id()
        return clone_with(parent, changes)

    def _for_run(self, config: RunConfig | None = None) -> RunContext[Data]:
        """A run's own context: derived (or resumed with ``config``), with request-scoped
        tools and a fresh control slot."""
        if config is None:
            config = _agent_run_config(self.config)
        return clone_with(
            self,
            {
                "config": config,
                "cancellation": self.cancellation.child(),
                "control": ControlSlot(),
                "tools": self.tools.for_new_run(),
            },
        )

    def _with(self, **changes: Any) -> RunContext[Data]:
        return attrs.evolve(self, **changes)

    # -- shortcuts -----------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def parent_run_id(self) -> str | None:
        return self.config.parent_run_id

    @property
    def root_run_id(self) -> str:
        return self.config.root_run_id

    @property
    def thread_id(self) -> str:
        return self.config.thread_id

    @property
    def tags(self) -> tuple[str, ...]:
        return self.config.tags

    @property
    def metadata(self) -> FrozenDict[str, Any]:
        return self.config.metadata

    @property
    def depth(self) -> int:
        return self.config.depth

    # -- control -------------------------------------------------------------------------

    def request_control(self, control: Control) -> None:
        """Ask the loop to stop or pause at its next safe checkpoint (highest precedence wins)."""
        self.control.request(control)

    def take_control(self) -> Control | None:
        return self.control.take()

    # -- events --------------------------------------------------------------------------

    def emit(self, event: Event | type[Event], /, **fields: Any) -> None:
        """Deliver an event stamped with this run's ids.

        ``ctx.emit(MyEvent, size=3)`` builds the event already stamped (one construction),
        and only when something would see it: with no subscriber, tap or logger at its
        level, the run's result builds it when its ``events`` are read
        (:mod:`tinyctx.event_log`); ``ctx.emit(MyEvent(size=3))`` stamps a copy of a
        built one.
        """
        config = self.config
        replaying = REPLAY_SOURCE.get()
        replayed = replaying is not None and replaying()
        if isinstance(event, type):
            # built only if anything would see it (see EventSink.emit_new)
            self.events.emit_new(event, fields, config, replayed)
            return
        if fields:
            raise TypeError("emit(event, **fields): fields go with an event class, not an event")
        event = event.stamped(
            run_id=config.run_id,
            parent_run_id=config.parent_run_id,
            root_run_id=config.root_run_id,
            thread_id=config.thread_id,
            tags=config.tags,
            lineage=config.lineage,
        )
        if replayed:
            event = clone_with(event, {"replayed": True})
        self.events.emit(event)

    async def publish(self, event: object, *, target: str | None = None) -> None:
        """Deliver ``event`` to the layer named ``target``, or to every layer in order.

        An unknown or ambiguous target raises ValueError and delivers nothing; a handler's
        error propagates and stops the broadcast (work already done is not rolled back).
        """
        bus = self.bus
        if bus is None:
            if target is not None:
                raise ValueError(f"publish: no layer named {target!r} (this context has no layers)")
            return
        await bus.publish(event, self, target=target)

    # -- per-tree state and background work ---------------------------------------------

    def state_for(self, owner: object, factory: Callable[[], T]) -> T:
        """Per-tree in-process state of ``owner`` (usually a layer), created on first use.

        A cache: it dies with the process. State that must survive (counters, pending
        work) goes in :meth:`thread_state` or :meth:`run_state`.
        """
        return self.cache.state_for(owner, factory)

    def thread_state(
        self,
        owner: object,
        factory: Callable[[], T],
        restore: Callable[[Any], T] | None = None,
    ) -> T:
        """The durable per-thread state of layer ``owner``, made or restored on first use.

        Kept with the thread's conversation and written with the thread by a Session with
        a store (see :mod:`tinyctx.state`): ``factory()`` makes it, the object's
        ``to_json()`` dumps it, ``restore(json)`` (default ``factory.from_json``) rebuilds
        it in a later session or process. Keyed by the layer's name.
        """
        return self.conversation.layer_state.get(owner, factory, restore)

    def run_state(
        self,
        owner: object,
        factory: Callable[[], T],
        restore: Callable[[Any], T] | None = None,
    ) -> T:
        """The durable state of layer ``owner`` for the agent run this context belongs to.

        Like :meth:`thread_state`, but per run: it travels in the checkpoint when the run
        pauses (so a resume, in any process, continues with it) and is dropped when the
        run ends any other way.
        """
        run = self.config.agent_run_id or self.config.run_id
        return self.run_states.of(run).get(owner, factory, restore)

    def thread_lease(self, store: object | None = None) -> Lease | None:
        """The lease this session holds on the thread of this context, now (read-only).

        A layer that writes elsewhere on the thread's behalf (notes in a
        :class:`~tinyctx.stores.Store`) passes it as ``fence=`` so a worker that lost the
        thread to another cannot write after it. None when the session has no store, or
        the context is of another thread. With ``store``, None too unless ``store`` is the
        one holding the lease: only that store can check a fence against it (another would
        refuse every fenced write, knowing no lease of the thread).
        """
        if store is not None and store is not self.lease_store:
            return None
        source = self.lease_source
        lease = source() if source is not None else None
        if lease is None or lease.thread_id != self.config.thread_id:
            return None
        return lease

    async def commit(self) -> None:
        """Make durable, now, what this context's conversation committed (new messages and
        compactions, with the layers' thread state): a Session with a store writes them
        before it returns; a no-op without a store, or when nothing changed.

        The loop calls it right before every model call (inside the innermost layer), so
        a persistent rewrite a layer made on the way in (a summary, cleared tool results,
        a budget relief) is in the store before the model sees it. A layer that calls a
        model handler of its own on the conversation's behalf calls it first. A failed
        write raises (the model is then not called) and stays pending for the next one.
        """
        source = self.commit_source
        if source is not None:
            await source(self)

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Start ``fn(*args)`` in the owning session's task group (never fire-and-forget)."""
        background = self.background
        if background is None:
            raise RuntimeError(
                "ctx.spawn needs a context owned by a Session (async with Session(...)); "
                "this context has no task group"
            )
        background.spawn(fn, *args, name=name, report=self.emit)
