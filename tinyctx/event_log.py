"""What a run keeps of its events, and events built only when read.

A :class:`~tinyctx.RunResult` carries its run's events. When nothing else listens (no
subscriber, no tap, no logger at the event's level), the sink hands the run's
:class:`EventLog` an event's class and arguments instead of the event, and the event is
built the first time the result's ``events`` are read, from the same arguments, with the
timestamp taken when it was emitted: equal to the event built at once. A run that nobody
watches builds no event object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from .events import Event

__all__ = ["EventLog", "RecordedEvents", "Stamp", "build_event", "deferrable"]

_ID_FIELDS = ("run_id", "parent_run_id", "root_run_id", "thread_id", "tags", "lineage")
_STAMP = frozenset((*_ID_FIELDS, "timestamp", "replayed"))


class _Layout:
    """What an event class allows to be built later, from the same arguments, unchanged:
    its field names and required ones; None for a class whose construction does more than
    store its arguments (a converter, a validator, a post-init hook)."""

    __slots__ = ("allowed", "required")

    def __init__(self, allowed: frozenset[str], required: frozenset[str]) -> None:
        self.allowed = allowed
        self.required = required


_LAYOUTS: dict[type[Event], _Layout | None] = {}


def _layout(cls: type[Event]) -> _Layout | None:
    try:
        return _LAYOUTS[cls]
    except KeyError:
        pass
    fields = attrs.fields(cls)
    plain = not any(a.converter is not None or a.validator is not None for a in fields) and not (
        hasattr(cls, "__attrs_post_init__") or hasattr(cls, "__attrs_pre_init__")
    )
    layout = None
    if plain:
        names = frozenset(a.name for a in fields if a.init) - _STAMP
        required = frozenset(a.name for a in fields if a.default is attrs.NOTHING)
        layout = _Layout(names, required)
    _LAYOUTS[cls] = layout
    return layout


class Stamp(Protocol):
    """The ids an event is stamped with (a :class:`~tinyctx.context.RunConfig`)."""

    @property
    def run_id(self) -> str: ...
    @property
    def parent_run_id(self) -> str | None: ...
    @property
    def root_run_id(self) -> str: ...
    @property
    def thread_id(self) -> str | None: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def lineage(self) -> tuple[str, ...]: ...


def build_event(cls: type[Event], fields: dict[str, Any], stamp: Stamp, **extra: Any) -> Event:
    """``cls(**fields)`` stamped with the ids of ``stamp`` (and ``extra``: a timestamp)."""
    return cls(
        **fields,
        run_id=stamp.run_id,
        parent_run_id=stamp.parent_run_id,
        root_run_id=stamp.root_run_id,
        thread_id=stamp.thread_id,
        tags=stamp.tags,
        lineage=stamp.lineage,
        **extra,
    )


_Deferred = tuple["type[Event]", dict[str, Any], Stamp, float, bool]


class EventLog:
    """A subscriber that keeps the events of one run tree (``root_run_id``), in order.

    What a :class:`~tinyctx.RunResult` carries as its ``events``. When it is the only one
    listening, the sink hands it an event's class and arguments instead of the event, and
    the event is built the first time the result's ``events`` are read: a run nobody
    watches builds no event object.
    """

    __slots__ = ("_entries", "_root")

    def __init__(self, root_run_id: str) -> None:
        self._root = root_run_id
        self._entries: list[Event | _Deferred] = []

    def __call__(self, event: Event) -> None:
        if event.root_run_id == self._root:
            self._entries.append(event)

    def defer(self, entry: _Deferred) -> None:
        if entry[2].root_run_id == self._root:
            self._entries.append(entry)

    def snapshot(self) -> RecordedEvents:
        """The events kept so far (later ones are not in it), built when first read."""
        return RecordedEvents(tuple(self._entries))


class RecordedEvents:
    """Events an :class:`EventLog` kept, built on first read (:meth:`built`)."""

    __slots__ = ("_entries", "_events")

    def __init__(self, entries: tuple[Event | _Deferred, ...]) -> None:
        self._entries = entries
        self._events: tuple[Event, ...] | None = None

    def built(self) -> tuple[Event, ...]:
        events = self._events
        if events is None:
            events = self._events = tuple(
                build_event(entry[0], entry[1], entry[2], timestamp=entry[3], replayed=entry[4])
                if isinstance(entry, tuple)  # deferred (an event is never a tuple)
                else entry
                for entry in self._entries
            )
            self._entries = ()
        return events

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordedEvents):
            return self.built() == other.built()
        if isinstance(other, tuple):
            return self.built() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.built())

    def __repr__(self) -> str:
        return f"RecordedEvents({self.built()!r})"


def deferrable(cls: type[Event], fields: dict[str, Any]) -> bool:
    """Whether ``cls(**fields)`` (stamped) can be built later with the same outcome: the
    class only stores its arguments (no converter, validator or post-init hook) and
    ``fields`` names only its fields and every required one (so building cannot fail)."""
    layout = _LAYOUTS.get(cls, _UNKNOWN)
    if layout is _UNKNOWN:
        layout = _layout(cls)
    # issuperset iterates the dict in C
    return (
        layout is not None
        and layout.allowed.issuperset(fields)
        and (not layout.required or layout.required <= fields.keys())
    )


_UNKNOWN: Any = object()
