"""The context view: task-level context materialized once per call, filtered, on every carrier.

A :class:`ContextView` is a frozen snapshot of what a model and the tools of one call may
know about the task: ``project_root``, ``work_dir``, ``task_metadata``, ``run_id``,
``aliases`` and free-form ``extra``. :class:`ViewSpec` builds it **once per call** from
four tiers, merged with *only-if-absent* semantics (the first tier that sets a value wins):

1. **step**: values for this one call: ``request.metadata[VIEW_STEP_KEY]`` (model calls; an
   outer layer puts them there), then ``ctx.config.configurable[VIEW_STEP_KEY]`` (any call;
   an outer layer derives a context with them).
2. **agent**: the values configured on the layer (``ViewSpec(agent={...})``).
3. **global**: ``ctx.config.configurable[VIEW_GLOBAL_KEY]``, set by the application on the
   session's ``RunConfig``; inside a nested call that already carries a materialized view
   (a tool, a sub-agent) that view replaces this tier, so a field an enclosing policy
   excluded can never come back from the raw global values.
4. **context**: ``run_id`` = the id of the agent run the call belongs to
   (``RunConfig.agent_run_id``; the context's own id outside a run).

Each tier is a mapping of field names to values: a named field of the view type sets that
field (``task_metadata``, ``aliases`` and ``extra`` take mappings and merge per entry), any
other key becomes an ``extra`` entry. A :class:`ContextPolicy` then filters the merged view
(default: pass-all); the filtered view is the only one that exists.

The same materialized object reaches both carriers:

* the model request: ``request.metadata[VIEW_KEY]`` and a header rendered at the end of the
  system prompt;
* the context handed to the inner layers, the model handler, tools and sub-agents:
  ``ctx.config.configurable[VIEW_KEY]`` (read it with :meth:`ContextView.of`), with the raw
  tiers shadowed so nothing unfiltered flows further down.

The renderer and the carriers iterate the view's fields generically, so a field added to
the view (an ``extra`` entry, or a named field of a :class:`ContextView` subclass) reaches
every carrier without touching any renderer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import attrs
from attrs import field, frozen

from tinyctx import ConfigError, Event, ModelRequest, RunContext
from tinyctx.config import Check, flag, implements, optional, owner_of, text
from tinyctx.events import EventLevel
from tinyctx.frozen import FrozenDict, clone_with, freeze, thaw

__all__ = [
    "VIEW_KEY",
    "VIEW_GLOBAL_KEY",
    "VIEW_STEP_KEY",
    "ContextView",
    "ContextPolicy",
    "ViewSpec",
    "Materialized",
    "ContextViewBuilt",
    "view_mapping",
    "with_step_values",
]

VIEW_KEY = "tinyctx.view"
"""Where the materialized :class:`ContextView` travels: ``request.metadata`` and the
derived context's ``config.configurable``."""
VIEW_GLOBAL_KEY = "tinyctx.view.global"
"""``RunConfig.configurable`` key of the application-wide (global) tier: a mapping."""
VIEW_STEP_KEY = "tinyctx.view.step"
"""``request.metadata`` / ``RunConfig.configurable`` key of the per-call (step) tier."""

_MAPPING_MARK = "tinyctx.view.mapping"
_EMPTY: FrozenDict[str, Any] = FrozenDict()


def _frozen_entries(value: Any) -> FrozenDict[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise TypeError(f"a context-view mapping field needs a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str) or not key:
            raise TypeError(f"context-view mapping keys must be non-empty strings, got {key!r}")
    frozen_value: FrozenDict[str, Any] = freeze(value) if value else _EMPTY
    return frozen_value


def view_mapping() -> Any:
    """An attrs field for a mapping-valued view field (entries merge and filter one by one).

    Use it when subclassing :class:`ContextView`: ``labels: FrozenDict[str, Any] =
    view_mapping()``; the policy can then address ``labels`` or ``labels.<key>``.
    """
    return field(factory=FrozenDict, converter=_frozen_entries, metadata={_MAPPING_MARK: True})


_text = optional(text(empty=True), allowed="a string, a path or None")


def _path_or_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


@frozen
class ContextView:
    """Task-level context for one call. Frozen; build it with :class:`ViewSpec`.

    Subclass it (``@attrs.frozen``) to add named fields; use :func:`view_mapping` for a
    mapping-valued one. Every field reaches the header, ``request.metadata`` and the
    context seen by tools and sub-agents with no renderer change.
    """

    project_root: str | None = field(default=None, converter=_path_or_text, validator=_text)
    work_dir: str | None = field(default=None, converter=_path_or_text, validator=_text)
    task_metadata: FrozenDict[str, Any] = field(
        factory=FrozenDict, converter=_frozen_entries, metadata={_MAPPING_MARK: True}
    )
    run_id: str | None = field(default=None, validator=_text)
    aliases: FrozenDict[str, Any] = field(
        factory=FrozenDict, converter=_frozen_entries, metadata={_MAPPING_MARK: True}
    )
    extra: FrozenDict[str, Any] = field(
        factory=FrozenDict, converter=_frozen_entries, metadata={_MAPPING_MARK: True}
    )

    # -- reading ---------------------------------------------------------------------------

    @classmethod
    def of(cls, ctx: RunContext[Any]) -> ContextView | None:
        """The view materialized for the call ``ctx`` belongs to (None outside of one)."""
        view = ctx.config.configurable.get(VIEW_KEY)
        return view if isinstance(view, ContextView) else None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(a.name for a in attrs.fields(cls))

    @classmethod
    def mapping_fields(cls) -> frozenset[str]:
        return frozenset(a.name for a in attrs.fields(cls) if a.metadata.get(_MAPPING_MARK))

    def fields(self) -> dict[str, Any]:
        """Every present value by path: ``name`` for a scalar, ``name.key`` for an entry."""
        out: dict[str, Any] = {}
        for attribute in attrs.fields(type(self)):
            value = getattr(self, attribute.name)
            if attribute.metadata.get(_MAPPING_MARK):
                for key, entry in value.items():
                    out[f"{attribute.name}.{key}"] = entry
            elif value is not None:
                out[attribute.name] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Present fields as plain JSON-ready values (mapping fields nested)."""
        out: dict[str, Any] = {}
        for attribute in attrs.fields(type(self)):
            value = getattr(self, attribute.name)
            if attribute.metadata.get(_MAPPING_MARK):
                if value:
                    out[attribute.name] = thaw(value)
            elif value is not None:
                out[attribute.name] = thaw(value)
        return out

    def __bool__(self) -> bool:
        return bool(self.fields())

    def render(self, tag: str = "context") -> str:
        """The header a model reads: exactly one ``path: value`` line per present field."""
        lines = [f"<{tag}>"]
        for path, value in self.fields().items():
            lines.append(f"{path}: {_header_value(value)}")
        lines.append(f"</{tag}>")
        return "\n".join(lines)


def _header_value(value: Any) -> str:
    """Plain single-line text as is; anything else (newlines, padding, "", non-strings) as
    JSON, so a value can never add a line to the header or end it early."""
    if isinstance(value, str) and value and value.isprintable() and value == value.strip():
        return value
    return json.dumps(thaw(value), ensure_ascii=False, default=str)


# ---------------------------------------------------------------------------------------
# policy


def _names(value: Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _exclude_names(value: Iterable[str] | None) -> tuple[str, ...]:
    return _names(value) or ()


def _check_names(instance: ContextPolicy, attribute: Any, value: tuple[str, ...] | None) -> None:
    if value is None:
        return
    view_type = instance.view_type
    names = view_type.field_names()
    mappings = view_type.mapping_fields()
    for name in value:
        ok = isinstance(name, str) and (
            name in names
            or (
                name.partition(".")[0] in mappings
                and bool(name.partition(".")[2])
                and "." not in name.partition(".")[2]
            )
        )
        if not ok:
            raise ConfigError(
                attribute.name,
                name,
                f"a field of {view_type.__name__} ({', '.join(names)}) or "
                f"'<field>.<key>' for one entry of {', '.join(sorted(mappings))}",
                owner="ContextPolicy",
            )


def _is_view_type(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, ContextView)


_view_type: Check[type[ContextView]] = Check(_is_view_type, "ContextView or a subclass")


@frozen
class ContextPolicy:
    """Which view fields a call may see. The default (``include=None``) passes everything.

    A name is a field (``"work_dir"``, ``"extra"``: the whole mapping) or one entry of a
    mapping field (``"extra.api_key"``, ``"task_metadata.ticket"``). A path is kept when it
    is included (``include`` is None, or names it or its field) and not excluded (``exclude``
    names neither it nor its field). Names are checked against ``view_type`` at construction.
    """

    include: tuple[str, ...] | None = field(default=None, converter=_names)
    exclude: tuple[str, ...] = field(default=(), converter=_exclude_names)
    view_type: type[ContextView] = field(default=ContextView, kw_only=True, validator=_view_type)

    def __attrs_post_init__(self) -> None:
        # validators that need view_type run after it is set
        _check_names(self, attrs.fields(ContextPolicy).include, self.include)
        _check_names(self, attrs.fields(ContextPolicy).exclude, self.exclude)

    @property
    def passes_all(self) -> bool:
        return self.include is None and not self.exclude

    def allows(self, path: str) -> bool:
        """Whether the field or entry at ``path`` survives this policy."""
        head = path.partition(".")[0]
        include = self.include
        if include is not None and path not in include and head not in include:
            return False
        exclude = self.exclude
        return not (path in exclude or head in exclude)


# ---------------------------------------------------------------------------------------
# materialization


@frozen
class ContextViewBuilt(Event):
    """A view was materialized for one call: the fields it carries, how many were filtered."""

    kind: ClassVar[str] = "context.view"
    level: ClassVar[EventLevel] = "debug"
    fields: tuple[str, ...] = ()
    excluded: int = 0


def _agent_tier(value: Mapping[str, Any] | None) -> FrozenDict[str, Any]:
    if value is None:
        return _EMPTY
    implements(Mapping, allowed="a mapping of view field names to values").check(
        value, "agent", "ViewSpec"
    )
    frozen_value: FrozenDict[str, Any] = freeze(value) if value else _EMPTY
    return frozen_value


def _policy(value: ContextPolicy | None) -> ContextPolicy:
    if value is None:
        return ContextPolicy()
    policy: ContextPolicy = implements(ContextPolicy, allowed="a ContextPolicy").check(
        value, "policy", "ViewSpec"
    )
    return policy


_spec_view_type = _view_type


def _tier(source: Any) -> Mapping[str, Any] | None:
    return source if isinstance(source, Mapping) and source else None


@frozen
class ViewSpec:
    """How a layer materializes the view: the agent tier, the policy and the header switch."""

    policy: ContextPolicy = field(factory=ContextPolicy, converter=_policy)
    agent: FrozenDict[str, Any] = field(factory=FrozenDict, converter=_agent_tier)
    header: bool = field(default=True, validator=flag())
    header_tag: str = field(default="context", validator=text(allowed="an identifier"))
    view_type: type[ContextView] = field(default=ContextView, validator=_spec_view_type)

    def __attrs_post_init__(self) -> None:
        if not issubclass(self.view_type, self.policy.view_type):
            raise ConfigError(
                "policy",
                self.policy,
                f"a ContextPolicy for {self.view_type.__name__} or one of its bases",
                owner=owner_of(self),
            )
        if not self.header_tag.isidentifier():
            raise ConfigError("header_tag", self.header_tag, "an identifier", owner=owner_of(self))
        # fail at construction, not at the first call, on an agent tier the view rejects
        self._build((self.agent,))

    # -- the four tiers ----------------------------------------------------------------------

    def tiers(
        self, ctx: RunContext[Any], request: ModelRequest | None = None
    ) -> Iterator[Mapping[str, Any]]:
        """The tiers for one call, highest precedence first."""
        configurable = ctx.config.configurable
        if request is not None:
            step = _tier(request.metadata.get(VIEW_STEP_KEY))
            if step is not None:
                yield step
        step = _tier(configurable.get(VIEW_STEP_KEY))
        if step is not None:
            yield step
        if self.agent:
            yield self.agent
        inherited = configurable.get(VIEW_KEY)
        if isinstance(inherited, ContextView):
            yield inherited.to_dict()
            return
        global_tier = _tier(configurable.get(VIEW_GLOBAL_KEY))
        if global_tier is not None:
            yield global_tier
        yield {"run_id": ctx.config.agent_run_id or ctx.run_id}

    def build(
        self, ctx: RunContext[Any], request: ModelRequest | None = None
    ) -> tuple[ContextView, int]:
        """The filtered view for one call and how many paths the policy removed (no event)."""
        return self._build(self.tiers(ctx, request))

    def materialize(
        self,
        ctx: RunContext[Any],
        request: ModelRequest | None = None,
        *,
        report_to: RunContext[Any] | None = None,
    ) -> ContextView:
        """Build the filtered view for one call from ``ctx`` (and ``request``'s step tier).

        A :class:`ContextViewBuilt` event (field names, never values) is emitted in
        ``report_to`` (default ``ctx``): the context of the call the view is for.
        """
        view, excluded = self.build(ctx, request)
        (report_to or ctx).emit(ContextViewBuilt(fields=tuple(view.fields()), excluded=excluded))
        return view

    def _build(self, tiers: Iterable[Mapping[str, Any]]) -> tuple[ContextView, int]:
        view_type = self.view_type
        names = view_type.field_names()
        mappings = view_type.mapping_fields()
        policy = self.policy
        scalars: dict[str, Any] = {}
        entries: dict[str, dict[str, Any]] = {name: {} for name in mappings}
        excluded: set[str] = set()
        for tier in tiers:
            for key, value in tier.items():
                if key in mappings:
                    if not isinstance(value, Mapping):
                        raise TypeError(
                            f"context view: {key!r} takes a mapping, got {type(value).__name__}"
                        )
                    target = entries[key]
                    for entry, entry_value in value.items():
                        path = f"{key}.{entry}"
                        if not policy.allows(path):
                            excluded.add(path)
                        elif entry not in target:
                            target[entry] = entry_value
                elif key in names:
                    if value is None:
                        continue
                    if not policy.allows(key):
                        excluded.add(key)
                    elif key not in scalars:
                        scalars[key] = value
                else:
                    path = f"extra.{key}"
                    if not policy.allows(path):
                        excluded.add(path)
                    elif key not in entries["extra"]:
                        entries["extra"][key] = value
        values: dict[str, Any] = dict(scalars)
        values.update((k, v) for k, v in entries.items() if v)
        view = view_type(**values)
        return view, len(excluded)

    # -- what outlives the call ---------------------------------------------------------------

    def redact_tier(self, tier: Mapping[str, Any]) -> FrozenDict[str, Any]:
        """``tier`` without the paths the policy excludes (what a checkpoint may keep)."""
        policy = self.policy
        if policy.passes_all:
            return tier if isinstance(tier, FrozenDict) else FrozenDict(tier)
        names = self.view_type.field_names()
        mappings = self.view_type.mapping_fields()
        kept: dict[str, Any] = {}
        for key, value in tier.items():
            if key in mappings and isinstance(value, Mapping):
                entries = {e: v for e, v in value.items() if policy.allows(f"{key}.{e}")}
                if entries:
                    kept[key] = FrozenDict(entries)
            elif policy.allows(key if key in names else f"extra.{key}"):
                kept[key] = value
        return FrozenDict(kept)

    def redact_configurable(self, configurable: Mapping[str, Any]) -> FrozenDict[str, Any]:
        """A run's ``configurable`` as a checkpoint may keep it: the raw view tiers without
        the excluded paths, and a materialized view (a nested run's) as a plain, filtered
        global tier, so the resumed run rebuilds the same view and nothing hidden is kept."""
        out = dict(configurable)
        for key in (VIEW_GLOBAL_KEY, VIEW_STEP_KEY):
            tier = out.get(key)
            if isinstance(tier, Mapping) and tier:
                out[key] = self.redact_tier(tier)
        view = out.pop(VIEW_KEY, None)
        if isinstance(view, ContextView):
            out[VIEW_GLOBAL_KEY] = self.redact_tier(freeze(view.to_dict()))
        elif view is not None:
            out[VIEW_KEY] = view
        return FrozenDict(out)

    # -- the carriers ------------------------------------------------------------------------

    def to_request(
        self, request: ModelRequest, view: ContextView, *, header: str | None = None
    ) -> ModelRequest:
        """The request that carries ``view``: metadata and (optionally) the header.

        ``header`` is the view's rendering when the caller has it already (None: render
        it here; an empty view gets no header).
        """
        metadata = request.metadata
        previous = metadata.get(VIEW_KEY)
        if VIEW_STEP_KEY in metadata:
            # the raw step tier is consumed: only the filtered view travels on
            metadata = FrozenDict({k: v for k, v in metadata.items() if k != VIEW_STEP_KEY})
        metadata = metadata | {VIEW_KEY: view}
        if self.header and header is None and view:
            header = view.render(self.header_tag)
        if not self.header or header is None:
            return request.evolve(metadata=metadata)
        system = request.system_prompt
        if system and isinstance(previous, ContextView):
            # an enclosing layer's header is replaced, never repeated
            stale = previous.render(self.header_tag)
            if system == stale:
                system = None
            elif system.endswith(f"\n\n{stale}"):
                system = system[: -len(stale) - 2]
        return request.evolve(
            metadata=metadata, system_prompt=f"{system}\n\n{header}" if system else header
        )

    @staticmethod
    def configurable_for(ctx: RunContext[Any], view: ContextView) -> FrozenDict[str, Any]:
        """What a derived context's ``configurable`` gains: the view, raw tiers shadowed."""
        values: dict[str, Any] = {VIEW_KEY: view}
        configurable = ctx.config.configurable
        for key in (VIEW_GLOBAL_KEY, VIEW_STEP_KEY):
            if key in configurable:
                values[key] = _EMPTY
        return FrozenDict(values)

    # -- once per call, reused while the inputs are the same ---------------------------------

    def for_call(
        self, ctx: RunContext[Any], request: ModelRequest | None = None
    ) -> tuple[Materialized, bool, ModelRequest | None]:
        """The materialized view for one call, whether it was built now, and ``request``
        carrying it (:meth:`to_request`; None for a tool call).

        Without step values the view depends only on the context's ``configurable`` (the
        global tier or an inherited view) and its agent run: while those are the same
        objects the previous call's frozen view is reused, not rebuilt, and a request that
        brings the previous call's metadata and system prompt (the usual case) gets the
        previous call's carrying metadata and prompt again, without merging or rendering.
        The memo holds only immutable values seen stepless, so an identical object needs no
        second look for step values.
        """
        memo = ctx.cache.state_for(self, _Memo)
        config = ctx.config
        configurable = config.configurable
        carried = memo.carried
        metadata = None if request is None else request.metadata
        if (
            configurable is not memo.configurable
            and _tier(configurable.get(VIEW_STEP_KEY)) is not None
        ) or (
            metadata is not None
            and (carried is None or metadata is not carried[1])
            and _tier(metadata.get(VIEW_STEP_KEY)) is not None
        ):
            # this call's own step values: its own view, never reused
            own = self._materialized(ctx, request)
            if request is None:
                return own, True, None
            return own, True, self.to_request(request, own.view, header=own.header)
        run = config.agent_run_id or config.run_id
        built = memo.value
        fresh = built is None or memo.configurable is not configurable or memo.run != run
        if built is None or fresh:
            built = self._materialized(ctx, request)
            memo.configurable, memo.run, memo.value = configurable, run, built
        if request is None:
            return built, fresh, None
        system = request.system_prompt
        if (
            carried is not None
            and carried[0] is built
            and carried[1] is metadata
            and carried[2] is system
        ):
            # both values came out of a checked request: no converter to run again
            carrying = clone_with(request, {"metadata": carried[3], "system_prompt": carried[4]})
            return built, fresh, carrying
        out = self.to_request(request, built.view, header=built.header)
        memo.carried = (built, metadata, system, out.metadata, out.system_prompt)
        return built, fresh, out

    def _materialized(self, ctx: RunContext[Any], request: ModelRequest | None) -> Materialized:
        view, excluded = self.build(ctx, request)
        return Materialized(
            view=view,
            excluded=excluded,
            fields=tuple(view.fields()),
            header=view.render(self.header_tag) if self.header and view else None,
            configurable=self.configurable_for(ctx, view),
        )


@frozen
class Materialized:
    """A view built for a call, with what its carriers need, computed once."""

    view: ContextView
    excluded: int
    fields: tuple[str, ...]
    header: str | None
    configurable: FrozenDict[str, Any]


class _Memo:
    __slots__ = ("carried", "configurable", "run", "value")

    def __init__(self) -> None:
        self.configurable: object = None
        self.run: str = ""
        self.value: Materialized | None = None
        # (view built, request metadata, system prompt) -> the carrying metadata and prompt
        self.carried: tuple[object, object, object, FrozenDict[str, Any], str | None] | None = None


def with_step_values(request: ModelRequest, values: Mapping[str, Any]) -> ModelRequest:
    """``request`` carrying step-tier ``values`` for this call (they override earlier ones)."""
    current = request.metadata.get(VIEW_STEP_KEY)
    merged = dict(current) if isinstance(current, Mapping) else {}
    merged.update(values)
    return request.with_metadata({VIEW_STEP_KEY: merged})
