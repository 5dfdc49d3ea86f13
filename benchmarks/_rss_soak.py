"""Resident memory over many durable sessions on one SQLite store (issue #32, item 13).

One process per configuration serves ``SESSIONS`` durable sessions one after another on
one ``SqliteStore`` (each: two runs, a tool call each, the default stack and session
memory) and samples, every 500 sessions: the RSS, its anonymous and file-backed parts
(``/proc/self/status``), SQLite's own heap (``sqlite3_status64``: its page cache, what
``cache_bytes`` bounds), the file's pages mapped into the process (``/proc/self/smaps``)
and Python's allocations (``tracemalloc``). ``beyond`` is the RSS less SQLite's heap:
what grows with sessions must be the page cache only, so ``beyond`` stays flat, and the
RSS itself once the page cache is full (the ``cache_bytes=2 MiB`` run fills it early).
What still grows is glibc's free chunks: the heap's pages the allocator keeps after they
were freed (``malloc_free``; ``mallinfo2``), while what is in use outside the page cache
(``held``) stays flat. ``malloc_trim(0)`` before each sample gives those pages back, and
the RSS is then flat too.

The configurations: trio and asyncio with the defaults; trio with a 2 MiB page cache;
trio with ``MALLOC_ARENA_MAX=2`` (glibc's arenas per thread: the store's thread has one);
trio with a 2 MiB page cache and ``malloc_trim(0)`` at each sample; trio with
``mmap_bytes=256 MiB``, the memory map earlier releases always set, which kept every page
of the file it read in the RSS.

Used by ``bench_load.py``; ``python benchmarks/_rss_soak.py [SESSIONS]`` runs it alone.
Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import anyio

from tinyctx import (
    Agent,
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
    Usage,
    tool,
)
from tinyctx.middleware import RuleExtractor, SessionMemory
from tinyctx.middleware.stacks import default_stack

EVERY = 500
CONFIGS: tuple[tuple[str, str, int, int, dict[str, str]], ...] = (
    # (name, loop, cache_bytes, mmap_bytes, environment)
    ("defaults", "trio", 64 << 20, 0, {}),
    ("defaults", "asyncio", 64 << 20, 0, {}),
    ("cache_bytes=2 MiB", "trio", 2 << 20, 0, {}),
    ("MALLOC_ARENA_MAX=2", "trio", 64 << 20, 0, {"MALLOC_ARENA_MAX": "2"}),
    ("malloc_trim(0) at each sample", "trio", 2 << 20, 0, {"RSS_SOAK_TRIM": "1"}),
    ("mmap_bytes=256 MiB (before)", "trio", 64 << 20, 256 << 20, {}),
)


def _sqlite_heap() -> Any:
    """``sqlite3_status64(SQLITE_STATUS_MEMORY_USED)`` of the library ``sqlite3`` loaded."""
    import sqlite3  # noqa: F401 - loads the library this reads

    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libsqlite3" in line or "_sqlite3" in line:
                lib = ctypes.CDLL(line.split()[-1])
                if hasattr(lib, "sqlite3_status64"):
                    return lib
    return None


def _sample(lib: Any, path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    mapped, current = 0, ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5:
                current = parts[-1] if len(parts) >= 6 else ""
            elif line.startswith("Rss:") and current.startswith(path):
                mapped += int(parts[1])
    out["mapped_file"] = mapped
    out["sqlite_heap"] = -1
    if lib is not None:
        now, high = ctypes.c_int64(), ctypes.c_int64()
        lib.sqlite3_status64(0, ctypes.byref(now), ctypes.byref(high), 0)
        out["sqlite_heap"] = now.value // 1024
    out["python"] = tracemalloc.get_traced_memory()[0] // 1024
    out["malloc_in_use"] = out["malloc_free"] = -1
    if _LIBC is not None:
        if os.environ.get("RSS_SOAK_TRIM"):
            _LIBC.malloc_trim(0)
        info = _LIBC.mallinfo2()
        out["malloc_in_use"], out["malloc_free"] = info.uordblks // 1024, info.fordblks // 1024
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> Any:
    """glibc's allocator statistics (``mallinfo2``, glibc 2.33+), or None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


async def _model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return ModelResponse(AssistantMessage(f"Noted: {last.text}."), usage=Usage(400, 5))
    call = ToolCall(f"call_{len(request.messages)}", "save", {"key": last.text})
    return ModelResponse(AssistantMessage("", (call,)), usage=Usage(300, 10))


@tool
async def save(key: str) -> str:
    """Save one value.

    Args:
        key: what to save
    """
    return f"saved {key}"


async def _child(sessions: int, cache_bytes: int, mmap_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "rss.db")
        lib = _sqlite_heap()
        async with SqliteStore(path, cache_bytes=cache_bytes, mmap_bytes=mmap_bytes) as store:
            memory = SessionMemory(
                RuleExtractor(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1
            )
            agent = Agent(
                model=_model, tools=[save], middleware=[*default_stack(), memory], name="rss"
            )
            config = RunConfig(max_tokens=200_000)
            tracemalloc.start()
            for index in range(sessions + 1):
                if index % EVERY == 0:
                    gc.collect()
                    print(json.dumps({"sessions": index, **_sample(lib, path)}), flush=True)
                async with Session(
                    agent, thread_id=f"t{index}", store=store, config=config
                ) as session:
                    for run in range(2):
                        await session.run(f"I prefer option {index}-{run}, always.")


def rss_soak(sessions: int) -> list[dict[str, Any]]:
    """One figures dict per configuration: the samples and the growth per session."""
    out: list[dict[str, Any]] = []
    for name, loop, cache_bytes, mmap_bytes, env in CONFIGS:
        args = ("--child", loop, str(sessions), str(cache_bytes), str(mmap_bytes))
        done = subprocess.run(
            [sys.executable, __file__, *args],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the RSS soak ({name}, {loop}) failed: {done.stderr[-2000:]}")
        samples = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        first, warm, last = samples[0], samples[1], samples[-1]
        span = last["sessions"] - warm["sessions"]

        def per_session(key: str, a: dict[str, int] = warm, b: dict[str, int] = last) -> float:
            return (b[key] - a[key]) * 1024 / span  # bytes per session after the warm-up

        beyond = [s["VmRSS"] - s["sqlite_heap"] for s in samples]
        # the RSS once the page cache is full (None: it still grew at the last sample)
        full = next(s for s in samples if s["sqlite_heap"] == last["sqlite_heap"])
        after_fill = None
        if full is not last and samples.index(full) > 0:
            after_fill = round(
                (last["VmRSS"] - full["VmRSS"]) * 1024 / (last["sessions"] - full["sessions"])
            )
        out.append(
            {
                "config": name,
                "loop": loop,
                "sessions": last["sessions"],
                "rss_mb": (round(first["VmRSS"] / 1024, 1), round(last["VmRSS"] / 1024, 1)),
                "page_cache_mb": round(last["sqlite_heap"] / 1024, 1),
                "cache_bytes_mb": cache_bytes >> 20,
                "mapped_file_mb": round(last["mapped_file"] / 1024, 1),
                "rss_per_session_b": round(per_session("VmRSS")),
                "rss_after_page_cache_filled_per_session_b": after_fill,
                "beyond_page_cache_per_session_b": round((beyond[-1] - beyond[1]) * 1024 / span),
                "python_per_session_b": round(per_session("python")),
                # what the process holds outside the page cache (glibc's free chunks apart)
                "held_beyond_page_cache_per_session_b": round(
                    per_session("malloc_in_use") - per_session("sqlite_heap")
                ),
                "malloc_free_per_session_b": round(per_session("malloc_free")),
                "samples": samples,
            }
        )
    return out


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
        loop, count, cache, mmap = sys.argv[2], *map(int, sys.argv[3:6])
        anyio.run(_child, count, cache, mmap, backend=loop)
        sys.exit(0)
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    for row in rss_soak(total):
        row.pop("samples")
        print(row)
