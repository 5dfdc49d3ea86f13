"""The new process of the write/read symmetry property (not a test module).

``python tests/symmetry_worker.py PLAN.json`` opens every thread the plan names, in a
process that wrote none of them, and prints one JSON line: the threads whose loaded values
differ from what the writing process expected, ``{"thread": ..., "expected": ...,
"loaded": ...}`` each (an empty list when every one survived).

The plan: ``{"backend": "trio" | "asyncio", "store": {...}, "threads": [...]}``, where the
store is ``{"kind": "sqlite", "path": ...}``, ``{"kind": "postgres", "url", "schema"}``,
``{"kind": "redis", "url", "prefix"}`` or ``{"kind": "memory"}``; each thread is
``{"id", "expected"}`` plus, for a MemoryStore (which no other process can open), the
documents it held (``messages``, ``checkpoint``, ``state``), written into a fresh one here.

Values are compared by :func:`canonical`, which does not use the codec: a codec that wrote
and read a value wrongly in the same way would still be caught.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs

from tinyctx import Agent, Session
from tinyctx.codec import decode_state
from tinyctx.testing import ScriptedModel
from tinyctx.threads import ThreadWrite

KEEPER = "keeper"
"""The name of the layer whose thread state the property writes."""


def canonical(value: Any) -> Any:
    """``value`` as nested tuples that compare (and print) the same in any process: type
    tags keep ``1``, ``1.0`` and ``True`` apart and floats exact (``-0.0`` included);
    mappings are sorted by key, lists and tuples are both sequences; attrs objects are
    their class name and fields."""
    if value is None or isinstance(value, (bool, str)):
        return (type(value).__name__, value)
    if isinstance(value, int):
        return ("int", str(int(value)))
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((key, canonical(item)) for key, item in value.items())))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(canonical(item) for item in value))
    if attrs.has(type(value)):
        fields = attrs.fields(type(value))
        return (
            type(value).__name__,
            tuple((f.name, canonical(getattr(value, f.name))) for f in fields),
        )
    raise TypeError(f"no canonical form for {type(value).__name__}")


def thread_view(messages: Any, paused: Any, state: str | None) -> str:
    """What a thread holds, as one ASCII string: its messages, its pause (node, message,
    payload, per-run layer state) and the keeper layer's thread state."""
    pause = None if paused is None else (paused.node, paused.message, paused.payload, paused.state)
    kept = decode_state(state).get(KEEPER) if state is not None else None
    return ascii(canonical({"messages": tuple(messages), "pause": pause, "state": kept}))


def open_store(spec: Mapping[str, Any]) -> Any:
    """A store object for the plan's store (not yet used)."""
    kind = spec["kind"]
    if kind == "sqlite":
        from tinyctx.stores import SqliteStore

        return SqliteStore(spec["path"])
    if kind == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        return PostgresStore(spec["url"], schema=spec["schema"])
    if kind == "redis":
        from tinyctx.backends.redis import RedisStore

        return RedisStore(spec["url"], prefix=spec["prefix"])
    from tinyctx.stores import MemoryStore

    return MemoryStore()


async def load(store: Any, thread_id: str) -> str:
    """The thread as a new Session opens it (plus its stored layer state)."""
    async with Session(Agent(ScriptedModel()), thread_id=thread_id, store=store) as session:
        messages, paused = session.conversation_messages, session.paused
    record = await store.load_thread(thread_id)
    return thread_view(messages, paused, record.state)


async def check(plan: Mapping[str, Any]) -> list[dict[str, str]]:
    store = open_store(plan["store"])
    differences = []
    try:
        for thread in plan["threads"]:
            if plan["store"]["kind"] == "memory" and thread["messages"]:
                write = ThreadWrite(
                    append=tuple(thread["messages"]), checkpoint=thread["checkpoint"]
                )
                if thread["state"] is not None:
                    write = attrs.evolve(write, state=thread["state"])
                await store.write(thread["id"], write, expected_version=0)
            loaded = await load(store, thread["id"])
            if loaded != thread["expected"]:
                differences.append(
                    {"thread": thread["id"], "expected": thread["expected"], "loaded": loaded}
                )
    finally:
        await store.aclose()
    return differences


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text(encoding="ascii"))
    print(json.dumps(anyio.run(check, plan, backend=plan["backend"])))


if __name__ == "__main__":
    main()
