"""A worker process of the multi-worker soak test (not a test module).

``python tests/soak_worker.py BACKEND URL NAME DIR WORKER SEED LOOP`` serves the soak's
threads from one PostgreSQL (``NAME`` is the schema) or Redis (``NAME`` is the key prefix)
until ``DIR/stop`` exists, on the ``LOOP`` event loop (``trio`` or ``asyncio``):

- one :class:`~tinyctx.Session` per request, leased by this process (owner = ``WORKER``);
- a request runs the thread's next run (``RUNS`` per thread), resumes a paused run — only
  one this process did not pause itself — with an approval, or closes a step a dead worker
  left open;
- every run calls tools; odd runs call ``deploy``, which :class:`Approvals` pauses for a
  human; the default stack and :class:`SessionMemory` (one note per request) are on.

Everything the checks need is appended, one ``os.write`` per line (a SIGKILL never leaves
half a line), to files in ``DIR``: ``audit-WORKER.log`` (leases granted, writes landed with
their fencing token and version, writes refused, pauses, resumes), ``journal.log`` (the
history every model call saw) and ``effects.log`` (every deploy that ran).
``python tests/soak_worker.py finish ...`` is one pass of the last workers (no kills): it
serves every thread until it is complete or paused by this pass; passes alternate until
every thread is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from tinyctx import (
    Agent,
    Approve,
    AssistantMessage,
    Interrupted,
    Message,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    ToolCall,
    Usage,
    UserMessage,
    tool,
)
from tinyctx.middleware import Approvals, SessionMemory
from tinyctx.middleware.stacks import default_stack
from tinyctx.threads import FencedOut, LeaseHeld, StaleThreadVersion

RUNS = 2
TTL = 1.0
HOT = 12
CONFIG = RunConfig(max_tokens=200_000)


def thread_ids(count: int) -> list[str]:
    return [f"soak-{index:03d}" for index in range(count)]


def digest(messages: Sequence[Message]) -> str:
    raw = json.dumps([[type(m).__name__, m.text] for m in messages])
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def append_line(path: Path, line: str) -> None:
    """One O_APPEND write: a SIGKILL never leaves half a line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def open_store(backend: str, url: str, name: str) -> Any:
    if backend == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        return PostgresStore(url, schema=name, pool_size=3)
    from tinyctx.backends.redis import RedisStore

    return RedisStore(url, prefix=name, max_connections=4)


def _forward(name: str) -> Any:
    async def forward(self: AuditedStore, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.inner, name)(*args, **kwargs)

    forward.__name__ = name
    return forward


class AuditedStore:
    """The store, with every lease granted and every write landed or refused logged."""

    def __init__(self, inner: Any, log: Path, owner: str) -> None:
        self.inner = inner
        self.log = log
        self.owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # the Store protocol's methods as class attributes: from Python 3.12 on, isinstance()
    # against a runtime-checkable protocol looks them up statically, never in __getattr__
    get = _forward("get")
    put = _forward("put")
    delete = _forward("delete")
    keys = _forward("keys")
    append_note = _forward("append_note")
    notes = _forward("notes")

    async def load_thread(self, thread_id: str) -> Any:
        return await self.inner.load_thread(thread_id)

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Any:
        lease = await self.inner.acquire_lease(thread_id, owner, ttl)
        append_line(self.log, f"lease {thread_id} {lease.token} {self.owner}")
        return lease

    async def renew_lease(self, lease: Any, ttl: float) -> Any:
        return await self.inner.renew_lease(lease, ttl)

    async def release_lease(self, lease: Any) -> None:
        await self.inner.release_lease(lease)

    async def write(self, thread_id: str, change: Any, *, expected_version: int, lease: Any) -> int:
        token = 0 if lease is None else lease.token
        try:
            version = await self.inner.write(
                thread_id, change, expected_version=expected_version, lease=lease
            )
        except FencedOut as exc:
            append_line(self.log, f"fenced {thread_id} {token} {exc.current} {self.owner}")
            raise
        except StaleThreadVersion as exc:
            append_line(self.log, f"stale {thread_id} {token} {exc.actual} {self.owner}")
            raise
        append_line(self.log, f"write {thread_id} {token} {version} {self.owner}")
        return version

    async def append_notes(
        self, namespace: str, texts: Any, *, metadata: Any = None, fence: Any = None
    ) -> Any:
        try:
            return await self.inner.append_notes(namespace, texts, metadata=metadata, fence=fence)
        except FencedOut as exc:
            thread = "-" if fence is None else fence.thread_id
            append_line(self.log, f"notes-fenced {thread} {exc.token} {exc.current} {self.owner}")
            raise

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        return await self.inner.list_threads(prefix=prefix, limit=limit)

    async def archived(self, thread_id: str) -> Any:
        return await self.inner.archived(thread_id)

    async def delete_thread(self, thread_id: str) -> bool:
        return await self.inner.delete_thread(thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


class OneNotePerRequest:
    """An extractor proposing one note per user request it has not noted yet."""

    name = "soak"

    async def extract(self, job: Any, ctx: RunContext[Any]) -> list[str]:
        known = set(job.existing_texts)
        return [
            f"noted: {m.text}"
            for m in job.new_messages
            if isinstance(m, UserMessage) and f"noted: {m.text}" not in known
        ]


def run_number(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if isinstance(m, UserMessage))


def build_agent(directory: Path, store: AuditedStore, owner: str) -> Agent:
    journal = directory / "journal.log"
    effects = directory / "effects.log"

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        messages = request.messages
        thread = ctx.config.thread_id
        append_line(journal, f"{thread} {len(messages)} {digest(messages)}")
        last = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
        request_text = messages[last].text
        k = int(request_text.rsplit(" ", 1)[1])
        answered = [
            m
            for m in messages[last + 1 :]
            if isinstance(m, AssistantMessage) and not m.metadata.get("tinyctx")
        ]
        usage = Usage(len(messages) * 30, 8)
        if answered:
            return ModelResponse(AssistantMessage(f"{thread} run {k} done"), usage=usage)
        calls = [ToolCall(f"{thread}-r{k}-lookup", "lookup", {"q": f"{thread} {k}"})]
        if k % 2 == 1:
            calls.append(ToolCall(f"{thread}-r{k}-deploy", "deploy", {"target": f"{thread}#{k}"}))
        return ModelResponse(AssistantMessage(f"{thread} run {k} working", calls), usage=usage)

    @tool
    async def lookup(q: str) -> str:
        """Look something up."""
        await anyio.sleep(random.random() * 0.005)
        return f"found {q}"

    @tool
    async def deploy(target: str) -> str:
        """Deploy (a side effect a human approves first)."""
        append_line(effects, f"{target} {owner}")
        return f"deployed {target}"

    memory = SessionMemory(
        OneNotePerRequest(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1
    )
    return Agent(
        model=model,
        tools=[lookup, deploy],
        middleware=[Approvals("deploy"), *default_stack(), memory],
    )


def session(agent: Agent, store: AuditedStore, thread: str, owner: str) -> Session[Any]:
    return Session(
        agent,
        config=CONFIG.evolve(thread_id=thread),
        store=store,
        owner=owner,
        lease_ttl=TTL,
        grace_period=2.0,
    )


async def serve(
    store: AuditedStore,
    agent: Agent,
    thread: str,
    owner: str,
    paused_by_me: set[str],
) -> str:
    """One request on ``thread``; what it did (for the caller's bookkeeping)."""
    log = store.log
    s = session(agent, store, thread, owner)
    try:
        await s.__aenter__()
    except LeaseHeld:
        return "busy"
    outcome = "idle"
    try:
        if s.paused is not None:
            if thread in paused_by_me:
                return "mine"
            decisions = {c.id: Approve() for c in s.paused.pending if c.name == "deploy"}
            append_line(log, f"resume {thread} {' '.join(decisions)} {owner}")
            await s.resume(decisions=decisions)
            paused_by_me.discard(thread)
            outcome = "resumed"
        elif s.abandoned:
            await s.recover("close")
            outcome = "recovered"
        elif run_number(s.conversation_messages) < RUNS:
            k = run_number(s.conversation_messages) + 1
            await s.run(f"{thread} request {k}")
            outcome = "ran"
        else:
            outcome = "complete"
    except Interrupted as paused:
        calls = [c["id"] for c in (paused.checkpoint.payload or {}).get("calls", ())]
        append_line(log, f"paused {thread} {' '.join(calls)} {owner}")
        paused_by_me.add(thread)
        outcome = "paused"
    except (FencedOut, StaleThreadVersion) as exc:
        append_line(log, f"lost {thread} {type(exc).__name__} {owner}")
        outcome = "lost"
    finally:
        try:
            await s.__aexit__(None, None, None)
        except (FencedOut, StaleThreadVersion) as exc:
            append_line(log, f"lost {thread} {type(exc).__name__} {owner}")
            outcome = "lost"
    return outcome


async def work(
    backend: str, url: str, name: str, directory: Path, owner: str, seed: int, threads: int
) -> None:
    rng = random.Random(seed)
    store = AuditedStore(open_store(backend, url, name), directory / f"audit-{owner}.log", owner)
    agent = build_agent(directory, store, owner)
    ids = thread_ids(threads)
    complete: set[str] = set()
    paused_by_me: set[str] = set()
    parent = os.getppid()
    stop = directory / "stop"
    try:
        while not stop.exists() and os.getppid() == parent and len(complete) < len(ids):
            # the oldest unfinished threads first: workers contend, so a frozen worker's
            # thread is soon taken over (and its late writes fenced out)
            thread = rng.choice([t for t in ids if t not in complete][:HOT])
            outcome = await serve(store, agent, thread, owner, paused_by_me)
            if outcome == "complete":
                complete.add(thread)
            elif outcome in ("busy", "mine"):
                await anyio.sleep(0.005)
    finally:
        await store.aclose()


async def finish(
    backend: str, url: str, name: str, directory: Path, owner: str, ids: list[str]
) -> None:
    """One pass of the last workers: each thread is served until it is complete or paused
    by this pass (another pass resumes that). Prints how many threads are left."""
    store = AuditedStore(open_store(backend, url, name), directory / f"audit-{owner}.log", owner)
    agent = build_agent(directory, store, owner)
    mine: set[str] = set()
    left = 0
    try:
        with anyio.fail_after(120):
            for thread in ids:
                while True:
                    outcome = await serve(store, agent, thread, owner, mine)
                    if outcome == "busy":  # a killed worker's lease: wait out its TTL
                        await anyio.sleep(TTL / 4)
                    elif outcome in ("complete", "mine"):
                        break
                left += outcome != "complete"
    finally:
        await store.aclose()
    print(f"left {left}")


if __name__ == "__main__":
    import structlog

    # an application configures logging: this one keeps only warnings and errors
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    command = sys.argv[1]
    if command == "work":
        backend, url, name, folder, owner, seed, loop, count = sys.argv[2:10]
        anyio.run(
            work, backend, url, name, Path(folder), owner, int(seed), int(count), backend=loop
        )
    else:
        backend, url, name, folder, owner, count, part, parts = sys.argv[2:10]
        ids = thread_ids(int(count))[int(part) :: int(parts)]
        anyio.run(finish, backend, url, name, Path(folder), owner, ids, backend="trio")
