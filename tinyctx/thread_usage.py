"""Usage totals stored with the thread: tokens and cost per run and in total.

Every run of a :class:`~tinyctx.Session` with a store adds what it used (tokens of every model call,
and the cost of those the context's price table prices) to the thread's usage record,
kept in the thread's state under ``"tinyctx.usage"`` and written with the run's last
write (atomically with its messages). A paused run records what it used before the pause;
its resume adds the rest to the same run. The record keeps the total and the newest
:data:`RUNS_KEPT` runs.

``await thread_usage(store, thread_id)`` reads it without loading a message (on a store
implementing :class:`~tinyctx.lifecycle.ThreadWindowStore`; another store loads the
thread); ``session.ctx.thread_state(USAGE_KEY, ThreadUsage)`` is the live record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from attrs import field, frozen

from .context import wall_clock
from .frozen import FrozenDict, thaw
from .lifecycle import ThreadWindowStore
from .model import Usage
from .state import StateError
from .threads import ThreadStore, check_thread_id

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["USAGE_KEY", "RUNS_KEPT", "RunUsage", "ThreadUsage", "thread_usage"]

USAGE_KEY: Final = "tinyctx.usage"
"""The name the usage record has in the thread's state."""

RUNS_KEPT: Final = 50
"""How many runs the record lists (the newest); the total counts every run."""

_FIELDS: Final = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")


@frozen
class RunUsage:
    """What one run (``run_id``) used: tokens, model calls and cost in USD (priced models)."""

    run_id: str
    usage: Usage = field(factory=Usage)
    calls: int = 0
    cost: float = 0.0
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id} if self.run_id else {}
        out.update({name: getattr(self.usage, name) for name in _FIELDS})
        out.update(calls=self.calls, cost=self.cost, updated_at=self.updated_at)
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunUsage:
        if not isinstance(data, Mapping):  # to_json keeps each run's as a FrozenDict
            raise TypeError(f"a run's usage must be a JSON object, got {type(data).__name__}")
        counts = {name: _count(data, name) for name in _FIELDS}
        usage = Usage(
            counts["input_tokens"],
            counts["output_tokens"],
            counts["cached_tokens"],
            reasoning_tokens=counts["reasoning_tokens"],
        )
        return cls(
            str(data.get("run_id", "")),
            usage,
            _count(data, "calls"),
            float(data.get("cost", 0.0)),
            float(data.get("updated_at", 0.0)),
        )

    def plus(self, usage: Usage, calls: int, cost: float, now: float) -> RunUsage:
        return RunUsage(self.run_id, self.usage + usage, self.calls + calls, self.cost + cost, now)


def _count(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"usage.{name} must be an integer >= 0, got {value!r}")
    return value


class ThreadUsage:
    """The thread's usage record: ``total`` over every run and the newest ``runs``."""

    __slots__ = ("_json", "runs", "total")

    def __init__(self, total: RunUsage | None = None, runs: list[RunUsage] | None = None) -> None:
        self.total = total if total is not None else RunUsage("")
        self.runs: list[RunUsage] = runs if runs is not None else []
        # each kept run's JSON, made once (a run's usage is immutable): the thread's state
        # is dumped at every write and encoded whenever it changed, and frozen entries the
        # last write held are not encoded again (tinyctx.codec.StateEncoder)
        self._json: dict[int, tuple[RunUsage, FrozenDict[str, Any]]] = {}

    def add(self, run_id: str, usage: Usage, calls: int, cost: float) -> None:
        """Add a part of run ``run_id`` (a whole run, or its part before or after a pause)."""
        now = wall_clock()
        self.total = self.total.plus(usage, calls, cost, now)
        for index in range(len(self.runs) - 1, -1, -1):
            if self.runs[index].run_id == run_id:
                entry = self.runs.pop(index).plus(usage, calls, cost, now)
                break
        else:
            entry = RunUsage(run_id).plus(usage, calls, cost, now)
        self.runs.append(entry)
        del self.runs[:-RUNS_KEPT]

    def run(self, run_id: str) -> RunUsage | None:
        """The usage of run ``run_id``, if it is among the runs kept."""
        return next((r for r in self.runs if r.run_id == run_id), None)

    def to_json(self) -> dict[str, Any]:
        known, kept = self._json, {}
        runs = []
        for run in self.runs:
            entry = known.get(id(run))
            if entry is None or entry[0] is not run:
                entry = (run, FrozenDict(run.to_json()))
            kept[id(run)] = entry
            runs.append(entry[1])
        self._json = kept
        return {"total": self.total.to_json(), "runs": runs}

    @classmethod
    def from_json(cls, data: Any) -> ThreadUsage:
        if not isinstance(data, dict):
            raise TypeError(f"a thread's usage must be a JSON object, got {type(data).__name__}")
        runs = data.get("runs", [])
        if not isinstance(runs, list):
            raise TypeError("usage.runs must be a JSON array")
        return cls(RunUsage.from_json(data.get("total", {})), [RunUsage.from_json(r) for r in runs])

    def __repr__(self) -> str:
        return f"<ThreadUsage total={self.total!r} runs={len(self.runs)}>"


def record_run(ctx: RunContext[Any], usage: Usage, calls: int, cost: float) -> None:
    """Add a run's part to the thread's record (the loop calls this as a run ends)."""
    try:
        record = ctx.thread_state(USAGE_KEY, ThreadUsage)
    except StateError:
        # a record edited outside tinyctx never stops a run: it starts again from here
        ctx.conversation.layer_state.discard(USAGE_KEY)
        record = ctx.thread_state(USAGE_KEY, ThreadUsage)
    record.add(ctx.config.agent_run_id or ctx.config.run_id, usage, calls, cost)


async def thread_usage(store: ThreadStore, thread_id: str) -> ThreadUsage:
    """The thread's usage record as stored, read without its messages where the store
    can (an empty record for a thread without one)."""
    from .codec import decode_state  # the codec imports the agent, which imports this

    check_thread_id(thread_id)
    if isinstance(store, ThreadWindowStore):
        state = (await store.load_window(thread_id, count=0)).state
    else:
        state = (await store.load_thread(thread_id)).state
    if state is None:
        return ThreadUsage()
    stored = decode_state(state).get(USAGE_KEY)
    return ThreadUsage() if stored is None else ThreadUsage.from_json(thaw(stored))
