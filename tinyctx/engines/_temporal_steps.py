"""A Temporal workflow's view of its steps and of the thread store: each is an activity,
whose answer the history keeps (see :mod:`tinyctx.engines.temporal`)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..steps import Envelope, NondeterminismError
from ..threads import FencedOut, Lease, ThreadStore, ThreadWrite
from . import StepStore, lease_from_json, lease_json

__all__ = ["ActivityRunner", "ActivityStore", "TemporalSteps"]


class TemporalSteps(Protocol):
    """What the workflow's steps need of their engine (a ``TemporalEngine``)."""

    name: str
    store: ThreadStore
    lease_ttl: float

    async def activity(
        self, name: str, arg: dict[str, Any], *, activity_id: str | None = None
    ) -> Any: ...


_RECLAIMS = 3
"""How often a write fenced out by its own owner takes the thread back and writes again
(each time a stalled attempt of an earlier lease call took it over meanwhile)."""


class ActivityRunner:
    """Steps of one workflow as activities (the envelope comes from the history on replay)."""

    def __init__(self, engine: TemporalSteps, layers: tuple[str, ...]) -> None:
        self.engine = engine
        self.layers = layers
        self._count = 0
        self.last: Envelope = {}
        """The envelope of the last step (a write's tells the lease it took over with)."""
        self.failed: NondeterminismError | None = None
        """Set at the first replayed step whose request differs: from then on no step or
        lease call schedules anything, so the session's cleanup adds no command that the
        history lacks, and the workflow task fails with this error (naming the step and
        the layer order), not with Temporal's own mismatch of the cleanup's commands."""

    def next_index(self) -> int:
        self._count += 1
        return self._count - 1

    async def step(
        self,
        name: str,
        digest: str,
        run: Callable[[], Coroutine[Any, Any, Envelope]],
        payload: Callable[[], dict[str, Any]],
    ) -> Envelope:
        arg = {"engine": self.engine.name, "digest": digest, **payload()}
        # the id is the step's position and name only: a replay that asks a different
        # request here gets the recorded envelope, whose digest EngineSteps compares and
        # refuses with a NondeterminismError naming the step and the layer order (a digest
        # in the id had Temporal refuse it first, naming neither)
        activity_id = f"{self._count}:{name}"
        self.check()
        envelope: Envelope = await self.engine.activity(name, arg, activity_id=activity_id)
        self.last = envelope
        if envelope.get("digest") != digest:
            self.failed = NondeterminismError(
                name,
                self._count - 1,
                self.layers,
                f"recorded digest {envelope.get('digest')!s:.12}, now {digest:.12}",
            )
            raise self.failed
        return envelope

    def check(self) -> None:
        """Raise the nondeterminism found earlier in this execution, if any."""
        if self.failed is not None:
            raise self.failed


class ActivityStore(StepStore):
    """The thread store seen from a workflow: loads, writes and lease calls are activities."""

    def __init__(self, engine: TemporalSteps, runner: ActivityRunner) -> None:
        super().__init__(engine.store, runner)
        self.engine = engine
        self.activity_runner = runner
        self.runner_check = runner.check
        self.taken: Lease | None = None
        """The lease a retried write took the thread over with (a newer token of the
        workflow's own owner): later writes and lease calls use it."""

    def _newest(self, lease: Lease | None) -> Lease | None:
        taken = self.taken
        if lease is None or taken is None or taken.token <= lease.token:
            return lease
        if (taken.thread_id, taken.owner) != (lease.thread_id, lease.owner):
            return lease
        return taken

    def _learn(self, lease: Lease | None) -> None:
        """Keep ``lease`` when it is newer than the one held: results arrive in history
        order, which need not be the order the store granted their tokens in."""
        if lease is not None and (self.taken is None or lease.token > self.taken.token):
            self.taken = lease

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """A write step; fenced out by a newer token of the workflow's own owner, the
        workflow takes the thread back and writes again.

        Only this workflow derives that owner, so the newer token was granted to one of
        its own activity attempts whose result the history never kept (a write retried
        after a kill takes the thread over first, and its worker may die before it
        reports). The workflow running now is the live one (Temporal accepts one
        execution's commands); the stalled attempt still holds an older token than the
        one taken back here, so the store goes on refusing it. A lease of another owner
        is a real loss: the FencedOut is raised."""
        for reclaims in range(_RECLAIMS + 1):
            held = self._newest(lease)
            try:
                return await self._write_step(thread_id, change, expected_version, held)
            except FencedOut:
                if held is None or reclaims == _RECLAIMS:
                    raise
                args = {"lease": lease_json(held), "ttl": self.engine.lease_ttl}
                reclaimed = await self._call("tinyctx.lease.reclaim", args)
                if reclaimed is None:
                    raise
                self._learn(lease_from_json(reclaimed))
        raise AssertionError("unreachable: the last reclaim's FencedOut is raised")

    async def _write_step(
        self, thread_id: str, change: ThreadWrite, expected_version: int, lease: Lease | None
    ) -> int:
        self.activity_runner.last = {}
        try:
            return await super().write(
                thread_id, change, expected_version=expected_version, lease=lease
            )
        finally:
            # a retried write took the thread over (even when its write was refused)
            output = self.activity_runner.last.get("output", {})
            self._learn(lease_from_json(output.get("lease")))

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        args = {"thread_id": thread_id, "owner": owner, "ttl": ttl}
        return self._lease(await self._call("tinyctx.lease.acquire", args))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        args = {"lease": lease_json(self._newest(lease)), "ttl": ttl}
        renewed = self._lease(await self._call("tinyctx.lease.renew", args))
        if renewed.token != lease.token:
            self._learn(renewed)
        return renewed

    async def release_lease(self, lease: Lease) -> None:
        await self._call("tinyctx.lease.release", {"lease": lease_json(self._newest(lease))})

    async def _call(self, name: str, args: dict[str, Any]) -> Any:
        self.runner_check()
        return await self.engine.activity(name, {"engine": self.engine.name, **args})

    @staticmethod
    def _lease(document: Any) -> Lease:
        lease = lease_from_json(document)
        assert lease is not None
        return lease
