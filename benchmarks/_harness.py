"""Shared timing helpers: best-of-N wall time per call, measured inside one event loop.

Benchmarks print ratios against a baseline measured in the same run, never absolute
thresholds in tests. Each benchmark module exposes ``run(quick: bool) -> list[Row]``.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import orjson

from tinyctx.codec import decode_messages, encode_messages
from tinyctx.messages import Message
from tinyctx.stores import SqliteStore

_T = TypeVar("_T")


@attrs.frozen
class Row:
    """One measured case: ``seconds`` per operation, and the baseline it is compared to."""

    group: str
    case: str
    seconds: float
    baseline: str | None = None
    baseline_seconds: float | None = None
    target: str | None = None
    met: bool | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    @property
    def ratio(self) -> float | None:
        if not self.baseline_seconds:
            return None
        return self.seconds / self.baseline_seconds


def best_of(
    fn: Callable[[], Any],
    *,
    number: int,
    repeat: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call of a sync ``fn``: best of ``repeat`` rounds of ``number`` calls.
    ``clock=time.process_time`` measures CPU time (steadier on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = clock()
            for _ in range(number):
                fn()
            elapsed = clock() - start
        finally:
            gc.enable()
        best = min(best, elapsed / number)
    return best


def best_of_fresh(
    fn: Callable[[_T], Any],
    make: Callable[[], _T],
    *,
    number: int,
    repeat: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call of ``fn(make())``: best of ``repeat`` rounds of ``number`` calls, each
    on a new input that ``make`` built before the round's clock started (a cold measurement
    that no cache left on an earlier input can help)."""
    best = float("inf")
    for _ in range(repeat):
        inputs = [make() for _ in range(number)]
        gc.collect()
        gc.disable()
        try:
            start = clock()
            for value in inputs:
                fn(value)
            elapsed = clock() - start
        finally:
            gc.enable()
        del inputs
        best = min(best, elapsed / number)
    return best


async def abest_of(fn: Callable[[], Awaitable[Any]], *, number: int, repeat: int = 5) -> float:
    """Seconds per await of ``fn()`` inside the running loop: best of ``repeat`` rounds."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for _ in range(number):
                await fn()
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed / number)
    return best


async def abest_of_fresh(
    fn: Callable[[_T], Awaitable[Any]],
    make: Callable[[], _T],
    *,
    number: int,
    repeat: int = 5,
) -> float:
    """Seconds per await of ``fn(make())`` inside the running loop: the async twin of
    :func:`best_of_fresh` (every call on an input built off the clock, never seen before)."""
    best = float("inf")
    for _ in range(repeat):
        inputs = [make() for _ in range(number)]
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for value in inputs:
                await fn(value)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        del inputs
        best = min(best, elapsed / number)
    return best


def verdict(
    seconds: float, peer_seconds: float | None, label: str = "<= LangChain"
) -> dict[str, Any]:
    """``target`` and ``met`` keywords of a :class:`Row` judged against its peer's time (no
    verdict when the peer is not installed)."""
    if peer_seconds is None:
        return {"target": None, "met": None}
    return {"target": label, "met": seconds <= peer_seconds}


def fresh_copy(history: Sequence[Message]) -> tuple[Message, ...]:
    """A new object for every message, tool call, argument mapping and string of
    ``history``, as a thread loaded from a store has: nothing a counter or layer remembered
    about ``history`` carries over (the input of a cold measurement)."""
    return decode_messages(encode_messages(history))


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def print_table(rows: list[Row]) -> None:
    header = f"{'group':<22} {'case':<34} {'time':>11} {'baseline':<28} {'ratio':>8}  target"
    print(header)
    print("-" * len(header))
    for row in rows:
        base = ""
        if row.baseline is not None and row.baseline_seconds is not None:
            base = f"{row.baseline} {fmt_seconds(row.baseline_seconds)}"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
        target = row.target or ""
        if row.met is not None:
            target += " MET" if row.met else " NOT MET"
        time_text = fmt_seconds(row.seconds)
        print(f"{row.group:<22} {row.case:<34} {time_text:>11} {base:<28} {ratio:>8}  {target}")


def shared_data() -> Path | None:
    """The shared data folder (real transcripts, tokenizers, texts): ``TINYCTX_SHARED_DATA``,
    else ``../shared/data`` beside the repository; None when absent."""
    repo = Path(__file__).resolve().parents[1]
    for candidate in (
        os.environ.get("TINYCTX_SHARED_DATA", ""),
        str(repo.parent / "shared" / "data"),
        "/work/shared/data",
    ):
        if candidate and (Path(candidate) / "transcripts").is_dir():
            return Path(candidate)
    return None


@contextmanager
def sqlite_read_floor(
    path: Path, query: str, params: tuple[Any, ...], json_column: int
) -> Iterator[Callable[[], list[Any]]]:
    """The floor of a store read: the same SELECT on the same file through the bare
    ``sqlite3`` module, then orjson on the same JSON text (no thread hop, no objects built)."""
    conn = sqlite3.connect(path, check_same_thread=False)
    try:

        def read() -> list[Any]:
            return [orjson.loads(row[json_column]) for row in conn.execute(query, params)]

        assert read(), f"the floor read nothing: {query} {params}"
        yield read
    finally:
        conn.close()


class FullSqliteStore(SqliteStore):
    """tinyctx's store at the peers' durability: ``synchronous=FULL`` (a benchmark hook on
    the store's private connect; the store itself has no such option)."""

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        conn.execute("PRAGMA synchronous=FULL")
        return conn


SERVICES = Path(__file__).resolve().parent.parent / ".ci" / "services.sh"


@contextmanager
def servers(needed_by: str) -> Iterator[tuple[str, str]]:
    """The PostgreSQL and Redis URLs: from the environment, or servers started here (and
    stopped after) with ``.ci/services.sh``; ``needed_by`` names the benchmark in the error
    when they cannot start."""
    pg, rd = os.environ.get("TINYCTX_TEST_POSTGRES_URL"), os.environ.get("TINYCTX_TEST_REDIS_URL")
    if pg and rd:
        yield pg, rd
        return
    done = subprocess.run(
        ["bash", str(SERVICES), "start", "--no-install"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{needed_by} needs PostgreSQL and Redis: {done.stderr}")
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    try:
        yield found["TINYCTX_TEST_POSTGRES_URL"], found["TINYCTX_TEST_REDIS_URL"]
    finally:
        subprocess.run(
            ["bash", str(SERVICES), "stop", found["TINYCTX_SERVICES_DIR"]], timeout=120, check=False
        )
