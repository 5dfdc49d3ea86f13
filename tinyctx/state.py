"""Layer state that survives the process: per thread, and per run (with a checkpoint).

An agent (and so each layer) is shared by every session, so a layer keeps its state in the
context, never on ``self``. ``ctx.state_for(self, factory)`` is an in-process cache (a
memo, a speed-up); what must *survive* — counters, a calibration, a breaker, pending work —
is declared with one of two calls, and the kernel persists it:

* ``ctx.thread_state(self, factory)``: state of the thread, kept with the thread's
  conversation. A ``Session`` with a ``store=`` writes it with the thread and loads it
  when a later session (another request, another worker) enters the thread. A sub-agent
  with its own conversation has its own.
* ``ctx.run_state(self, factory)``: state of one agent run (``RunConfig.agent_run_id``).
  When the run pauses on an Interrupt it travels in ``Checkpoint.state``, so
  ``Session.resume`` in any process continues with it; it is dropped when the run ends
  any other way.

``factory()`` makes fresh state; the state object has ``to_json()`` returning plain JSON
(dicts with string keys, lists, strings, finite numbers, booleans, None). ``restore(json)``
rebuilds it, by default ``factory.from_json(json)``. State is keyed by the layer's *name*
(``Layer.name``): a later process finds it under the same name, and two layers sharing a
name must be of one class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

from .errors import TinyCtxError
from .frozen import HUGE_INT, MAX_NESTING, SPLIT_PAIR, text_fits, thaw, value_fits

__all__ = [
    "DurableState",
    "LayerStates",
    "RunStates",
    "StateError",
    "check_json",
]

S = TypeVar("S")


@runtime_checkable
class DurableState(Protocol):
    """What ``ctx.thread_state`` / ``ctx.run_state`` keep: an object that dumps to JSON."""

    def to_json(self) -> Any:
        """Plain JSON (dict/list/str/int/float/bool/None) from which ``restore`` rebuilds it."""
        ...


class StateError(TinyCtxError):
    """Layer state that cannot be kept or restored (named layer, and why)."""


def check_json(value: Any, path: str, _depth: int = 1) -> None:
    """Raise :class:`StateError` naming the path of the first value that is not plain JSON
    a thread can keep (``_depth``: the objects around it; a layer's state is kept one
    object down, in the mapping of every layer's state)."""
    if isinstance(value, str):
        if not text_fits(value):
            raise StateError(f"{path}: the string {value!r} {SPLIT_PAIR}")
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not value_fits(value):
            raise StateError(f"{path}: {HUGE_INT}")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StateError(f"{path}: {value!r} is not a finite number (JSON has no NaN/inf)")
        return
    if isinstance(value, (Mapping, list, tuple)) and _depth >= MAX_NESTING:
        raise StateError(
            f"{path}: nested deeper than {MAX_NESTING} levels of objects and arrays, the "
            "mapping of layer states counted (tinyctx.codec.MAX_NESTING)"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise StateError(f"{path}: key {key!r} is not a string")
            if not text_fits(key):
                raise StateError(f"{path}: key {key!r} {SPLIT_PAIR}")
            check_json(item, f"{path}.{key}", _depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(item, f"{path}[{index}]", _depth + 1)
        return
    raise StateError(
        f"{path}: {type(value).__name__} is not JSON (dict, list, str, number, bool, None)"
    )


def _name_of(owner: object) -> str:
    if isinstance(owner, str):
        if not owner:
            raise ValueError("layer state needs a non-empty name")
        return owner
    name = getattr(owner, "name", None) or getattr(owner, "__name__", None)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"layer state needs a named owner (a Layer or a function), got {type(owner).__name__}"
        )
    return name


_EMPTY: dict[str, Any] = {}
"""The empty dict every empty scope shares (never written: replaced first)."""


class LayerStates:
    """The durable state objects of one scope (a thread or a run), by layer name.

    Holds live objects and the stored JSON of layers that have not asked for theirs yet
    (restored lazily, on first use, by the layer's own ``restore``), so a dump never loses
    the state of a layer this process did not touch.
    """

    __slots__ = ("_live", "_stored")

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        # an empty scope shares one empty dict per kind (replaced before any write)
        self._live: dict[str, tuple[type, Any]] = _EMPTY
        self._stored: dict[str, Any] = dict(stored) if stored else _EMPTY

    def get(
        self,
        owner: object,
        factory: Callable[[], S],
        restore: Callable[[Any], S] | None = None,
    ) -> S:
        """The state of ``owner`` here: live, else restored from stored JSON, else new."""
        name = owner if type(owner) is str else getattr(owner, "name", None) or _name_of(owner)
        entry = self._live.get(name)
        kind = type(owner)
        if entry is not None:
            if entry[0] is not kind:
                raise StateError(
                    f"layer state {name!r} belongs to a {entry[0].__name__}, not a "
                    f"{kind.__name__}: two layers of different classes share the name"
                )
            value: S = entry[1]
            return value
        if name in self._stored:
            data = self._stored[name]
            loader = restore if restore is not None else getattr(factory, "from_json", None)
            if loader is None:
                raise StateError(
                    f"layer state {name!r}: stored state found but no way to restore it "
                    "(pass restore=, or give the state class a from_json classmethod)"
                )
            try:
                state = loader(thaw(data))
            except Exception as exc:
                raise StateError(
                    f"layer state {name!r}: the stored state could not be restored: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            del self._stored[name]
        else:
            state = factory()
        if not callable(getattr(state, "to_json", None)):
            raise StateError(
                f"layer state {name!r}: {type(state).__name__} has no to_json(); durable "
                "state must dump to JSON (use ctx.state_for for an in-process cache)"
            )
        if self._live is _EMPTY:
            self._live = {}
        self._live[name] = (kind, state)
        return state

    def dump(self, *, check: bool = True) -> dict[str, Any]:
        """Every layer's state as plain JSON, by name. Checked (StateError names the path)
        unless ``check=False``, for a caller whose encoder checks it anyway."""
        out = dict(self._stored)
        for name, (_, state) in self._live.items():
            value = state.to_json()
            if check:
                check_json(value, name)
            out[name] = value
        return dict(sorted(out.items()))

    def load(self, data: Mapping[str, Any] | None) -> None:
        """Forget everything and hold ``data`` (name -> JSON) for lazy restoring."""
        self._live = _EMPTY
        self._stored = dict(data) if data else _EMPTY

    def clear(self) -> None:
        self.load(None)

    def discard(self, name: str) -> None:
        """Forget the state kept under ``name`` (live or stored), if any."""
        if name in self._live:
            del self._live[name]
        if name in self._stored:
            del self._stored[name]

    def __contains__(self, name: object) -> bool:
        return name in self._live or name in self._stored

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*self._live, *self._stored}))

    def __len__(self) -> int:
        return len({*self._live, *self._stored})

    def __bool__(self) -> bool:
        return bool(self._live) or bool(self._stored)

    def __repr__(self) -> str:
        return f"<LayerStates live={sorted(self._live)} stored={sorted(self._stored)}>"


class RunStates:
    """Per-run :class:`LayerStates`, keyed by agent run id; shared by a session's tree."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[str, LayerStates] = _EMPTY  # made on first write

    def _writable(self) -> dict[str, LayerStates]:
        runs = self._runs
        if runs is _EMPTY:
            runs = self._runs = {}
        return runs

    def of(self, run_id: str) -> LayerStates:
        states = self._runs.get(run_id)
        if states is None:
            states = self._writable()[run_id] = LayerStates()
        return states

    def load(self, run_id: str, data: Mapping[str, Any] | None) -> None:
        """Start ``run_id`` (a resumed run) from a checkpoint's state."""
        self._writable()[run_id] = LayerStates(data)

    def pop(self, run_id: str) -> LayerStates | None:
        runs = self._runs
        return runs.pop(run_id) if run_id in runs else None

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __len__(self) -> int:
        return len(self._runs)

    def __repr__(self) -> str:
        return f"<RunStates runs={len(self._runs)}>"
