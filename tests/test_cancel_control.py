"""CancellationToken semantics and control-outcome precedence."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import CancellationToken, Interrupt, RunCancelled, RunContext, StopWithFinal
from tinyctx.control import ControlSlot, stronger


class TestCancellationToken:
    """cancel() latches and flows to children; waiting is cancel-safe."""

    def test_created_and_cancelled_outside_an_event_loop(self) -> None:
        token = CancellationToken()
        assert not token.is_cancelled()
        token.cancel("stop")
        token.cancel("again")
        assert token.is_cancelled()
        assert token.reason == "stop"
        with pytest.raises(RunCancelled, match="stop"):
            token.raise_if_cancelled("here")

    def test_child_follows_parent_never_the_reverse(self) -> None:
        parent = CancellationToken()
        child = parent.child()
        grandchild = child.child()
        child.cancel()
        assert grandchild.is_cancelled()
        assert not parent.is_cancelled()
        other = parent.child()
        parent.cancel()
        assert other.is_cancelled()
        assert parent.child().is_cancelled()

    async def test_cancelled_wakes_waiters(self) -> None:
        token = CancellationToken()
        woke: list[str] = []

        async def waiter(name: str) -> None:
            await token.cancelled()
            woke.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "a")
            tg.start_soon(waiter, "b")
            await anyio.wait_all_tasks_blocked()
            assert woke == []
            token.cancel()
        assert sorted(woke) == ["a", "b"]
        await token.cancelled()  # already cancelled: returns at once

    async def test_cancelled_is_cancel_safe_in_a_race(self) -> None:
        token = CancellationToken()
        with anyio.move_on_after(0.01):
            await token.cancelled()
        # the abandoned wait left nothing behind that a later cancel would trip over
        assert not token._scopes  # None or empty
        token.cancel()
        assert token.is_cancelled()

    async def test_race_stops_a_hanging_operation(self) -> None:
        token = CancellationToken()

        async def hang() -> str:
            await anyio.sleep_forever()
            return "never"

        async def cancel_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            token.cancel("user pressed stop")

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            with pytest.raises(RunCancelled, match="user pressed stop"):
                await token.race(hang, "stream")

    async def test_race_returns_the_value_when_not_cancelled(self) -> None:
        token = CancellationToken()

        async def work() -> int:
            await anyio.lowlevel.checkpoint()
            return 7

        assert await token.race(work) == 7

    async def test_linked_scope_of_parent_cancels_child_scope(self) -> None:
        parent = CancellationToken()
        child = parent.child()

        async def cancel_parent() -> None:
            await anyio.wait_all_tasks_blocked()
            parent.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_parent)
            with pytest.raises(RunCancelled, match="chunk"), child.linked_scope("chunk"):
                await anyio.sleep_forever()


controls = st.one_of(
    st.builds(StopWithFinal, st.text(max_size=5)),
    st.builds(Interrupt, st.text(min_size=1, max_size=5), st.text(max_size=5)),
)


class TestControlPrecedence:
    """The slot keeps the strictly higher precedence; a tie keeps the first request."""

    def test_kinds_and_precedence(self) -> None:
        assert StopWithFinal("x").kind == "stop_with_final"
        assert StopWithFinal("x").precedence == 1
        assert Interrupt("n", "m").kind == "interrupt"
        assert Interrupt("n", "m").precedence == 2

    @given(requests=st.lists(controls, max_size=12))
    def test_slot_equals_max_precedence_first_wins_ties(
        self, requests: list[StopWithFinal | Interrupt]
    ) -> None:
        slot = ControlSlot()
        for control in requests:
            slot.request(control)
        expected = None
        if requests:
            best = max(c.precedence for c in requests)
            expected = next(c for c in requests if c.precedence == best)
        assert slot.peek() is expected
        assert slot.take() is expected
        assert slot.take() is None

    def test_interrupt_is_never_downgraded_to_a_stop(self) -> None:
        ctx = RunContext.new()
        ctx.request_control(Interrupt("review", "hold"))
        ctx.derive().request_control(StopWithFinal("stop"))
        assert ctx.take_control() == Interrupt("review", "hold")
        assert ctx.take_control() is None

    def test_stronger_and_bad_requests(self) -> None:
        stop, pause = StopWithFinal("a"), Interrupt("n")
        assert stronger(None, stop) is stop
        assert stronger(stop, pause) is pause
        assert stronger(pause, StopWithFinal("b")) is pause
        assert stronger(stop, StopWithFinal("b")) is stop
        with pytest.raises(TypeError, match="StopWithFinal or Interrupt"):
            ControlSlot().request("stop")  # type: ignore[arg-type]
