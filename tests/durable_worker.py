"""Worker processes for the durable-thread crash and approval tests (not a test module).

``python tests/durable_worker.py zygote DB DIR`` imports everything once, then forks one
fresh worker process per ``spawn LANE SEED`` line on stdin (answering ``pid N``), so a
trial costs a fork, not an interpreter start. Each worker of a lane:

1. **checks** every thread of its lane, as loaded from the SQLite file by this new
   process: pairing intact; no message duplicated; every history any model call of any
   earlier worker saw (the journal) still a prefix of the stored log, so no committed
   message was lost; each completed run made at most 2 model calls and ran ``ask`` at most
   once (the per-run limits); every ``ask`` result in the log ran exactly once (the side
   effects file);
2. **finishes** what the last worker left: every stored checkpoint is resumed to the end
   of its run (each resume in a new Session, as a new web request would), every abandoned
   step is recovered;
3. writes ``checked PID ...`` to the lane's status file, then **works**: one Session per
   request, runs that pause for approval and resumes, until the test SIGKILLs it.

``python tests/durable_worker.py approve DB DIR`` and ``... resume DB DIR`` are the two
processes of the approval test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from tinyctx import (
    Agent,
    AssistantMessage,
    Interrupt,
    Interrupted,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    tool,
)
from tinyctx.codec import decode_checkpoint, decode_messages
from tinyctx.decisions import decisions_from_json
from tinyctx.frozen import thaw
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.middleware import Approvals, CallLimits, SessionMemory, subagent_tool
from tinyctx.middleware.stacks import default_stack
from tinyctx.threads import LeaseHeld
from tinyctx.tools import Injected

TTL = 0.6
THREADS_PER_LANE = 3


def texts_digest(messages: tuple[Message, ...]) -> str:
    raw = json.dumps([[type(m).__name__, m.text] for m in messages])
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def append_line(path: Path, line: str) -> None:
    """One O_APPEND write: a SIGKILL never leaves half a line behind another process's."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class ApprovalGate(Layer):
    """Pauses the run for a human whenever the model asks for ``ask``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "ask" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "may I ask?"))
        return response


def model_calls_this_run(messages: tuple[Message, ...]) -> int:
    calls = 0
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, AssistantMessage) and not message.metadata.get("tinyctx"):
            calls += 1
    return calls


def build_agent(directory: Path, store: SqliteStore, thread: str) -> Agent:
    journal = directory / "journal.txt"
    effects = directory / "effects.txt"

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        messages = request.messages
        append_line(journal, f"{thread} {len(messages)} {texts_digest(messages)}")
        await anyio.sleep(random.random() * 0.01)
        n = len(messages)
        if model_calls_this_run(messages) >= 2:
            answer = AssistantMessage(f"{thread} done at {n}")
            return ModelResponse(answer, usage=Usage(n * 40, 5))
        calls = (ToolCall(f"{thread}-{n}-ask", "ask"), ToolCall(f"{thread}-{n}-work", "work"))
        step = AssistantMessage(f"{thread} step at {n}", calls)
        return ModelResponse(step, usage=Usage(n * 40, 9))

    @tool
    async def ask(ctx: Injected[RunContext[Any]]) -> str:
        """Ask the user something (a side effect that must happen at most once)."""
        call_id = ctx.config.metadata.get("tool_call_id")
        append_line(effects, str(call_id))
        return f"asked {call_id}"

    @tool
    async def work() -> str:
        """Some work."""
        await anyio.sleep(random.random() * 0.01)
        return "worked"

    memory = SessionMemory(store=store, min_tokens=0, min_tool_calls=1, min_turns=1)
    return Agent(
        model=model,
        tools=[ask, work],
        middleware=[
            CallLimits(model_calls=2, per_tool={"ask": 1}, scope="run", exit="end"),
            CallIdInMetadata(),
            ApprovalGate(),
            *default_stack(),
            memory,
        ],
    )


class CallIdInMetadata(Layer):
    """Hands the tool its call id (so the side effect can name it)."""

    async def wrap_tool(self, call: ToolCall, ctx: RunContext[Any], call_next: Any) -> ToolResult:
        child = ctx.derive(metadata={"tool_call_id": call.id})
        result: ToolResult = await call_next(call, child)
        return result


CONFIG = RunConfig(max_tokens=200_000)


def session(agent: Agent, store: SqliteStore, thread: str) -> Session[Any]:
    return Session(
        agent,
        config=CONFIG.evolve(thread_id=thread),
        store=store,
        lease_ttl=TTL,
        grace_period=0.5,
    )


async def open_when_free(agent: Agent, store: SqliteStore, thread: str) -> Session[Any]:
    """A session on ``thread``, waiting out a dead worker's lease."""
    while True:
        s = session(agent, store, thread)
        try:
            await s.__aenter__()
        except LeaseHeld:
            await anyio.sleep(TTL / 4)
            continue
        return s


class CheckFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def check_thread(directory: Path, store: SqliteStore, thread: str) -> dict[str, int]:
    record = await store.load_thread(thread)
    messages = decode_messages(record.messages)
    check_pairing(messages)
    # every message a model or a tool produced is unique by construction (the thread,
    # the history length, the call id); the framework's own stop messages may repeat
    produced = [m for m in messages if not m.metadata.get("tinyctx")]
    check(len(set(produced)) == len(produced), f"{thread}: a message is duplicated")
    journal = directory / "journal.txt"
    seen = journal.read_text().splitlines() if journal.exists() else []
    for line in seen:
        name, n, digest = line.split()
        if name != thread:
            continue
        count = int(n)
        check(
            len(messages) >= count,
            f"{thread}: a model saw {count} messages, {len(messages)} are stored",
        )
        check(
            texts_digest(messages[:count]) == digest,
            f"{thread}: the stored history differs from what a model saw at {count}",
        )
    open_calls = pending_tool_calls(messages)
    if record.checkpoint is not None:
        checkpoint = decode_checkpoint(record.checkpoint)
        check(checkpoint.pending == open_calls, f"{thread}: checkpoint pending != open calls")
    effects = directory / "effects.txt"
    ran = effects.read_text().split() if effects.exists() else []
    check(len(ran) == len(set(ran)), "an approved tool ran twice")
    for message in messages:
        if isinstance(message, ToolResult) and message.text.startswith("asked "):
            check(message.tool_call_id in ran, f"{thread}: ask result without its run")
    # per-run limits: at most 2 model calls and one ask run between user messages
    run_model = run_ask = 0
    for message in messages:
        if isinstance(message, UserMessage):
            run_model = run_ask = 0
        elif isinstance(message, AssistantMessage) and not message.metadata.get("tinyctx"):
            run_model += 1
        elif isinstance(message, ToolResult) and message.name == "ask":
            run_ask += message.text.startswith("asked ")
        check(run_model <= 2, f"{thread}: a run made {run_model} model calls (limit 2)")
        check(run_ask <= 1, f"{thread}: ask ran {run_ask} times in one run (limit 1)")
    return {"messages": len(messages), "paused": int(record.checkpoint is not None)}


async def finish_thread(directory: Path, store: SqliteStore, thread: str) -> str:
    """Resume a stored checkpoint to the end of its run (a new Session per resume) or
    recover an abandoned step; returns what was done."""
    agent = build_agent(directory, store, thread)
    done = "idle"
    for _ in range(4):
        s = await open_when_free(agent, store, thread)
        try:
            if s.paused is not None:
                try:
                    result = await s.resume()
                except Interrupted:
                    done = "resumed+paused"
                    continue
                check(result.model_calls <= 2, f"{thread}: resumed run made {result.model_calls}")
                done = "resumed"
            elif s.abandoned:
                # closed, not continued: a continued step is a run without its own user
                # message, and the per-run checks below find runs by user messages
                await s.recover("close")
                done = "recovered"
            return done
        finally:
            await s.__aexit__(None, None, None)
    return done


async def work(directory: Path, store: SqliteStore, threads: list[str], rng: random.Random) -> None:
    turn = 0
    zygote = os.getppid()
    while os.getppid() == zygote:  # never outlive the test's zygote
        thread = rng.choice(threads)
        agent = build_agent(directory, store, thread)
        s = await open_when_free(agent, store, thread)
        try:
            if s.paused is not None:
                await s.resume()
            elif s.abandoned:
                await s.recover("close")
            else:
                turn += 1
                await s.run(f"{thread} {os.getpid()} request {turn}")
        except Interrupted:
            pass
        finally:
            await s.__aexit__(None, None, None)


async def worker(db: str, directory: Path, lane: str, seed: int) -> None:
    store = SqliteStore(db)
    threads = [f"{lane}-t{k}" for k in range(THREADS_PER_LANE)]
    status = directory / f"status-{lane}.txt"
    try:
        stats = [await check_thread(directory, store, t) for t in threads]
        done = [await finish_thread(directory, store, t) for t in threads]
        for t in threads:
            await check_thread(directory, store, t)
            record = await store.load_thread(t)
            check(record.checkpoint is None, f"{t}: a checkpoint is left after finishing")
            check_pairing(decode_messages(record.messages), allow_pending=False)
    except Exception as exc:
        append_line(status, f"FAIL {os.getpid()} {type(exc).__name__}: {exc}")
        raise
    append_line(status, f"checked {os.getpid()} {json.dumps(stats)} {json.dumps(done)}")
    if seed >= 0:  # a negative seed: the final check, which only checks and finishes
        await work(directory, store, threads, random.Random(seed))
    await store.aclose()


def zygote(db: str, directory: Path) -> None:
    children: list[int] = []
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "quit":
            break
        if parts[0] == "reap":
            for pid in list(children):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.remove(pid)
            continue
        _, lane, seed = parts
        pid = os.fork()
        if pid == 0:
            # the worker's output (its logs) goes to a file; stdout is the zygote's replies
            log = os.open(directory / f"log-{lane}.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                anyio.run(worker, db, directory, lane, int(seed), backend="trio")
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        children.append(pid)
        print(f"pid {pid}", flush=True)
    for pid in children:  # the test is over: whatever still works is stopped
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# -- the approval test's two processes ---------------------------------------------------


def approval_agent(directory: Path) -> Agent:
    effects = directory / "deploys.txt"

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        if not any(isinstance(m, ToolResult) for m in request.messages):
            return ModelResponse(AssistantMessage("", (ToolCall("d1", "deploy"),)))
        return ModelResponse(AssistantMessage("deployed, all done"))

    @tool
    async def deploy() -> str:
        """Deploy to production (needs approval)."""
        append_line(effects, f"deploy by {os.getpid()}")
        return "deployed"

    class DeployGate(Layer):
        async def wrap_model(
            self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
        ) -> ModelResponse:
            response = await call_next(request, ctx)
            if any(c.name == "deploy" for c in response.message.tool_calls):
                ctx.request_control(Interrupt("approval", "deploy to production?"))
            return response

    return Agent(model=model, tools=[deploy], middleware=[DeployGate()])


def subagent_approval_agent(directory: Path) -> Agent:
    """A parent whose ``helper`` sub-agent deploys under ``Approvals``."""
    effects = directory / "deploys.txt"

    async def child_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        if not any(isinstance(m, ToolResult) for m in request.messages):
            return ModelResponse(AssistantMessage("", (ToolCall("d1", "deploy"),)))
        return ModelResponse(AssistantMessage("helper deployed"))

    async def parent_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        if not any(isinstance(m, ToolResult) for m in request.messages):
            call = ToolCall("h1", "helper", {"task": "ship it"})
            return ModelResponse(AssistantMessage("", (call,)))
        return ModelResponse(AssistantMessage("parent done"))

    @tool
    async def deploy() -> str:
        """Deploy to production (needs approval)."""
        append_line(effects, f"deploy by {os.getpid()}")
        return "deployed"

    helper = Agent(model=child_model, tools=[deploy], middleware=[Approvals("deploy")])
    return Agent(model=parent_model, tools=[subagent_tool(helper, name="helper")])


async def approve_phase(db: str, directory: Path, phase: str) -> None:
    store = SqliteStore(db)
    subagent = phase.startswith("sub-")
    phase = phase.removeprefix("sub-")
    agent = subagent_approval_agent(directory) if subagent else approval_agent(directory)
    async with Session(agent, thread_id="ops", store=store) as s:
        if phase == "approve" and subagent:
            try:
                await s.run("ship it")
            except Interrupted as paused:
                card = thaw(paused.payload)
                print(f"paused {paused.node} {[c['id'] for c in card['calls']]}")
        elif subagent:
            assert s.paused is not None, "process B found no paused run"
            decisions = decisions_from_json(json.loads('{"d1": {"type": "approve"}}'))
            result = await s.resume(decisions=decisions)
            print(f"resumed {result.status} {result.final_text}")
        elif phase == "approve":
            try:
                await s.run("ship it")
            except Interrupted as paused:
                print(f"paused {paused.node} {[c.name for c in paused.checkpoint.pending]}")
        else:
            assert s.paused is not None, "process B found no paused run"
            result = await s.resume()
            print(f"resumed {result.status} {result.final_text}")
    await store.aclose()


if __name__ == "__main__":
    command, db_path, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if command == "zygote":
        zygote(db_path, folder)
    else:
        anyio.run(approve_phase, db_path, folder, command, backend="trio")
