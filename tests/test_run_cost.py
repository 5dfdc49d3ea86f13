"""The shortcuts that cut a run's fixed cost (issue #39, gap 2) answer what the general
path answers: cached tool specs, text-only message checks, the input's pairing check, run
ids drawn ahead, the kernel request's flaws, the session's scheduler checkpoint."""

from __future__ import annotations

import os
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import Agent, AssistantMessage, Session, ToolCall, ToolResult, UserMessage, tool
from tinyctx.cancel import CancellationToken, SchedulerCheckpoint, scheduler_checkpoint
from tinyctx.context import new_run_id
from tinyctx.errors import PairingError, RunCancelled
from tinyctx.frozen import clone_with
from tinyctx.messages import check_pairing, valid_message, valid_text
from tinyctx.model import ModelRequest, ModelResponse
from tinyctx.request_rules import InvalidModelRequest, RequestRule, request_flaws
from tinyctx.run_input import check_input
from tinyctx.tool_types import ServerTool, ToolRegistry

pytestmark = pytest.mark.anyio


def _tool(name: str) -> Any:
    async def run(text: str) -> str:
        return text

    run.__name__ = name
    return tool(run)


_NAMES = st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), unique=True, max_size=6)


class TestToolSpecsKeptOnce:
    """A registry's specs and server tools are what its tools say, whatever a run registers."""

    @given(base=_NAMES, local=_NAMES, server=st.lists(st.sampled_from(["x", "y"]), unique=True))
    def test_specs_and_server_tools_equal_those_read_from_the_tools(
        self, base: list[str], local: list[str], server: list[str]
    ) -> None:
        registry = ToolRegistry([_tool(n) for n in base], [ServerTool(f"{s}_0") for s in base[:1]])
        run = registry.for_new_run()
        assert run.specs() == tuple(t.spec for t in run)
        for name in local:
            if name not in base:
                run.register(_tool(name))
        for kind in server:
            run.register_server_tool(ServerTool(kind))
        assert run.specs() == tuple(t.spec for t in run)
        assert run.server_tools == (
            *(ServerTool(f"{s}_0") for s in base[:1]),
            *(ServerTool(kind) for kind in server),
        )
        # the next run starts from the agent level again
        fresh = registry.for_new_run()
        assert fresh.specs() == tuple(t.spec for t in registry)
        assert fresh.server_tools == registry.server_tools


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)


def _general_valid(message: Any) -> Any:
    """valid_message's answer for a message without calls, spelled out: its text made valid."""
    changes: dict[str, Any] = {}
    fixed = valid_text(message.content)
    if fixed != message.content:
        changes["content"] = fixed
    return attrs.evolve(message, **changes) if changes else message


class TestTextOnlyMessagesChecked:
    """A text-only message comes back the same object when valid, else with its text made valid."""

    @given(text=_TEXT, kind=st.sampled_from([UserMessage, AssistantMessage, ToolResult]))
    def test_the_short_path_equals_the_general_answer(self, text: str, kind: Any) -> None:
        message = kind(content=text, tool_call_id="c1") if kind is ToolResult else kind(text)
        checked = valid_message(message)
        assert checked == _general_valid(message)
        assert checked.content == valid_text(text)
        assert (checked is message) == (valid_text(text) is text)

    @given(text=_TEXT, argument=_TEXT)
    def test_an_assistant_message_with_calls_has_its_arguments_checked_too(
        self, text: str, argument: str
    ) -> None:
        message = AssistantMessage(text, tool_calls=(ToolCall("c1", "t", {"q": argument}),))
        checked = valid_message(message)
        assert checked.content == valid_text(text)
        assert checked.tool_calls[0].arguments["q"] == valid_text(argument)


_MESSAGES = st.lists(
    st.one_of(
        st.builds(UserMessage, st.just("u")),
        st.builds(AssistantMessage, st.just("a")),
        st.builds(
            lambda i: AssistantMessage("", tool_calls=(ToolCall(f"c{i}", "t", {}),)),
            st.integers(0, 3),
        ),
        st.builds(lambda i: ToolResult(content="r", tool_call_id=f"c{i}"), st.integers(0, 3)),
    ),
    max_size=6,
)


def _paired(messages: tuple[Any, ...]) -> bool:
    try:
        check_pairing(messages, allow_pending=False)
    except PairingError:
        return False
    ids = [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    return len(ids) == len(set(ids))


class TestInputCheckedAsTheWholeThread:
    """Input is refused exactly when the thread with it would break pairing."""

    @given(history=_MESSAGES, added=_MESSAGES)
    def test_refused_iff_the_whole_thread_breaks_pairing(
        self, history: list[Any], added: list[Any]
    ) -> None:
        before = tuple(history)
        if not _paired(before + (UserMessage("next"),)):
            return  # only a paired history reaches a run
        messages = tuple(added)
        used = {c.id for m in before if isinstance(m, AssistantMessage) for c in m.tool_calls}
        try:
            check_input(before, messages, used, paused=False)
        except PairingError:
            refused = True
        else:
            refused = False
        assert refused == (bool(messages) and not _paired(before + messages))


class TestChildrenOfAToken:
    """Cancelling a token cancels every child still alive, and the children made from them."""

    @given(steps=st.lists(st.booleans(), max_size=200))
    def test_every_live_child_is_cancelled(self, steps: list[bool]) -> None:
        parent = CancellationToken()
        kept = []
        for keep in steps:
            child = parent.child()
            if keep:
                kept.append(child)
        grandchild = kept[0].child() if kept else None
        parent.cancel("stop")
        assert all(c.is_cancelled() and c.reason == "stop" for c in kept)
        assert grandchild is None or grandchild.is_cancelled()

    def test_a_child_made_after_the_cancel_is_cancelled_at_once(self) -> None:
        parent = CancellationToken()
        parent.cancel("late")
        child = parent.child()
        assert child.is_cancelled() and child.reason == "late"

    def test_the_first_reason_wins_down_the_tree(self) -> None:
        """A child asked after its parent's cancel, or cancelled itself later, reports the
        parent's reason (its own cancel came second)."""
        parent = CancellationToken()
        child, other = parent.child(), parent.child()
        grandchild = child.child()
        parent.cancel("first")
        child.cancel("second")
        assert child.reason == grandchild.reason == other.reason == "first"
        assert grandchild.is_cancelled() and other.is_cancelled()

    async def test_a_scope_deep_in_the_tree_is_cancelled_with_the_root(self) -> None:
        """A wait on a grandchild (``linked_scope``) ends when the root is cancelled, and
        a sibling's wait too, although no token registered before it waited."""
        root = CancellationToken()
        grandchild, sibling = root.child().child(), root.child()
        ended: list[str] = []

        async def wait(token: CancellationToken, name: str) -> None:
            with pytest.raises(RunCancelled, match="stop"), token.linked_scope(name):
                await anyio.sleep_forever()
            ended.append(name)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(wait, grandchild, "deep")
                group.start_soon(wait, sibling, "near")
                await anyio.wait_all_tasks_blocked()
                root.cancel("stop")
        assert sorted(ended) == ["deep", "near"]


class TestCloneWithSlottedClasses:
    """``clone_with`` of a fully slotted frozen class equals ``attrs.evolve`` with the same
    changes, and leaves the original as it was."""

    @given(
        changes=st.dictionaries(
            st.sampled_from(["system_prompt", "model", "messages"]),
            st.sampled_from([None, "x", "y"]),
            max_size=3,
        )
    )
    def test_equals_evolve(self, changes: dict[str, Any]) -> None:
        request = ModelRequest(messages=(UserMessage("hi"),), model="m", system_prompt="s")
        changes = {
            k: (UserMessage(v or "z"),) if k == "messages" else v for k, v in changes.items()
        }
        assert clone_with(request, changes) == attrs.evolve(request, **changes)
        assert request == ModelRequest(messages=(UserMessage("hi"),), model="m", system_prompt="s")


class TestEachRunsConfig:
    """Each run's config is its session's, one level down, with a fresh id of its own,
    however runs of several sessions alternate."""

    async def test_alternating_sessions_keep_their_own_identity(self) -> None:
        async def answer(request: Any, ctx: Any) -> ModelResponse:
            return ModelResponse(AssistantMessage("ok"))

        agent = Agent(model=answer)
        seen: set[str] = set()
        async with Session(agent, thread_id="t-a") as a, Session(agent, thread_id="t-b") as b:
            for _ in range(3):
                for session, thread in ((a, "t-a"), (b, "t-b")):
                    result = await session.run("hi")
                    config = session.ctx.config
                    run = result.events[0]
                    assert result.thread_id == run.thread_id == thread
                    assert run.parent_run_id == config.run_id
                    assert run.root_run_id == config.root_run_id
                    assert run.lineage == (config.run_id,)
                    seen.add(result.run_id)
        assert len(seen) == 6


class TestRunIdsDrawnAhead:
    """Run ids are 32 hex characters, never repeated, and a forked child draws its own."""

    def test_ids_are_unique_hex(self) -> None:
        ids = [new_run_id() for _ in range(1000)]
        assert len(set(ids)) == 1000
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
    def test_a_forked_child_never_hands_out_the_parents_ids(self) -> None:
        new_run_id()  # ids are drawn ahead in the parent now
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next ids, then out at once
            os.close(read)
            os.write(write, "".join(new_run_id() for _ in range(8)).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            child_ids = pipe.read().decode()
        os.waitpid(pid, 0)
        parent_ids = [new_run_id() for _ in range(8)]
        child = {child_ids[at : at + 32] for at in range(0, len(child_ids), 32)}
        assert len(child) == 8
        assert not child & set(parent_ids)


class TestKernelRequestFlaws:
    """The loop's own request is noted with the flaws request_flaws finds in it."""

    @given(
        ends=st.sampled_from([None, "user", "assistant"]),
        prefill=st.booleans(),
    )
    def test_the_noted_flaws_are_request_flaws(self, ends: str | None, prefill: bool) -> None:
        messages: tuple[Any, ...] = ()
        if ends == "user":
            messages = (UserMessage("u"),)
        elif ends == "assistant":
            messages = (UserMessage("u"), AssistantMessage("a"))
        request = ModelRequest(messages=messages)
        rule = RequestRule(prefill)
        expected = request_flaws(request, prefill)
        outer = RequestRule(prefill).guard(_answer, "layer")
        undo = rule.kernel_request(request)
        try:
            # a layer passing the kernel's own request on is never blamed for its flaws
            assert outer(request, None) == "answered"
        finally:
            undo()
        if expected:
            with pytest.raises(InvalidModelRequest):
                outer(request, None)


def _answer(request: Any, ctx: Any) -> str:
    return "answered"


async def _stops_a_cancelled_scope(checkpoint: Any) -> None:
    """``checkpoint()`` inside a cancelled scope raises there: nothing after it runs."""
    reached = False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await checkpoint()
        reached = True
    assert scope.cancelled_caught and not reached


class TestSchedulerCheckpoint:
    """A session's checkpoint yields to other tasks and is where a cancellation lands."""

    async def test_it_lets_another_task_run(self) -> None:
        checkpoint = scheduler_checkpoint()
        seen: list[str] = []

        async def other() -> None:
            seen.append("other")

        async with anyio.create_task_group() as group:
            group.start_soon(other)
            for _ in range(100):  # nothing but the checkpoint lets the other task in
                await checkpoint()
                if seen:
                    break
            assert seen == ["other"]

    async def test_a_cancelled_scope_stops_at_it(self) -> None:
        await _stops_a_cancelled_scope(scheduler_checkpoint())


class TestSessionCheckpointBudget:
    """A session yields to the scheduler at least once a millisecond of running, and a
    host's cancellation lands at every checkpoint, yielded or not."""

    async def test_the_first_checkpoint_yields(self) -> None:
        """Another task gets in at a fresh checkpoint's first call (trio orders a batch at
        random, so over many fresh checkpoints; without a yield it never would)."""
        let_in = 0
        for _ in range(50):
            checkpoint = SchedulerCheckpoint()
            seen: list[str] = []

            async def other(seen: list[str] = seen) -> None:
                seen.append("other")

            async with anyio.create_task_group() as group:
                group.start_soon(other)
                await checkpoint()
                let_in += bool(seen)
        assert let_in > 0

    async def test_a_cancellation_lands_between_two_turns(self) -> None:
        checkpoint = SchedulerCheckpoint()
        await checkpoint()  # the turn: the next one is within the budget, so no yield
        await _stops_a_cancelled_scope(checkpoint)

    async def test_a_session_that_never_waits_still_lets_others_in(self) -> None:
        """Instant runs, back to back: another task gets its turn (with no yield it never
        would; 100,000 runs is many seconds of a millisecond budget)."""
        session_runs = 0
        other_ran = anyio.Event()

        async def other() -> None:
            other_ran.set()

        async def instant(request: Any, ctx: Any) -> ModelResponse:
            return ModelResponse(AssistantMessage("ok"))  # never waits: no checkpoint

        agent = Agent(model=instant)
        with anyio.fail_after(30):
            async with Session(agent) as session, anyio.create_task_group() as group:
                await session.run("first")  # its first checkpoint yields
                group.start_soon(other)
                while not other_ran.is_set() and session_runs < 100_000:
                    session.ctx.conversation.replace((), emit_new=False)
                    await session.run("hi")
                    session_runs += 1
                let_in = other_ran.is_set()  # before the group's exit waits for it
        assert let_in
