"""The ``tinyctx`` command: replay a real transcript through a stack of layers.

    tinyctx                      replay the bundled transcript through the default stack
    tinyctx replay [TRANSCRIPT|-] [--window N] [--reserve N] [--stack NAME|FILE]
                   [--tokenizer FILE|HUB-NAME] [--format NAME] [--json] [--plot FILE.svg]
                   [--price MODEL] [--prices FILE.toml] [--sweep [0.2,0.4,...]]
    tinyctx stats TRANSCRIPT|- [--tokenizer FILE|HUB-NAME] [--json]

Stacks and layers are found by name through entry points (``tinyctx.stacks`` and
``tinyctx.layers``), so the kernel knows no concrete layer and an application can register
its own layers for ``--stack FILE``. Every failure is one line on stderr and an exit code
of its own (:data:`EXIT_CODES`); output to a closed pipe ends quietly.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import os
import socket
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata, resources
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TextIO
from urllib.parse import urlparse

from .chain import LayerLike
from .errors import ConfigError, TinyCtxError
from .messages import AssistantMessage, Message, ToolResult
from .ordering import OrderingError, check_ordering
from .tokens import TokenCounter, default_counter

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    from .cost import ModelPrice, SweepPoint

__all__ = [
    "main",
    "load_stack",
    "load_stack_at",
    "StackError",
    "bundled_transcript",
    "default_reserve",
    "EXIT_CODES",
]

DEFAULT_WINDOW = 32_000
MAX_DEFAULT_RESERVE = 4_000
BUNDLED = "marot__spotter__cc-main-4d5611e5.jsonl"
HUB_TIMEOUT = 3.0
"""Seconds to wait for the Hugging Face hub to answer before failing with a hint."""

EXIT_OK = 0
EXIT_STOPPED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_TOKENIZER = 4
EXIT_EMPTY = 5
EXIT_OUTPUT = 6
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_STOPPED: "the stack could not keep the transcript inside the window (replay stopped)",
    EXIT_USAGE: "bad command line: unknown command or flag, bad value, bad --stack",
    EXIT_INPUT: "the transcript cannot be read: missing, a directory, bad JSON, unknown format",
    EXIT_TOKENIZER: "the tokenizer cannot be loaded: missing file, offline hub, bad file",
    EXIT_EMPTY: "the transcript holds no messages or no model call to replay",
    EXIT_OUTPUT: "the --plot file cannot be written: missing directory, a directory, not .svg",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_PIPE: "the reader of the output went away (a closed pipe; nothing printed)",
}
"""Every exit code of the command and what it means (listed by ``--help``)."""

COMMANDS = ("replay", "stats")

# the transcript formats ``--help`` lists (``--format`` takes the names)
FORMAT_HELP: dict[str, str] = {
    "openai": "OpenAI chat messages: a JSON list, JSONL, or a request with 'messages'",
    "anthropic": "Anthropic Messages API: JSON (with 'system') or JSONL",
    "claude_code": "Claude Code session logs (~/.claude/projects/*/*.jsonl), sub-agents too",
    "swe_agent": "SWE-agent trajectories (.traj, 'history')",
    "mini_swe_agent": "mini-swe-agent trajectories (.traj.json)",
    "openhands": "OpenHands evaluation output.jsonl (one instance per line, 'history' events)",
    "tau_bench": "tau-bench results JSON (a list of tasks, each with a 'traj' of messages)",
    "agent_tars": "Agent TARS run logs: session dumps, event streams, llm-request snapshots",
}


def default_reserve(window: int) -> int:
    """The output reserve when ``--reserve`` is not given: an eighth of the window, at most
    4000 tokens (4000 at the default 32K window; 500 at a 4000-token window)."""
    return min(MAX_DEFAULT_RESERVE, window // 8)


class StackError(TinyCtxError, ValueError):
    """A stack file or name that cannot be built; the message names the file and place."""


class CommandError(Exception):
    """A failure of the command: one line on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CommandError(message, code)


# ---------------------------------------------------------------------------------------
# stacks and layers by name


def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


StackFactory = Callable[..., Sequence[LayerLike]]


def _build(name: str, args: dict[str, Any], where: str, counter: TokenCounter | None = None) -> Any:
    layers = _entry_points("tinyctx.layers")
    if name not in layers:
        known = ", ".join(sorted(layers)) or "none installed"
        raise StackError(f"{where}: unknown layer {name!r} (known: {known})")
    factory = layers[name].load()
    nested = args.pop("policies", None)
    if nested is not None:
        if not isinstance(nested, list):
            raise StackError(f"{where}: 'policies' must be an array of tables")
        args["policies"] = [
            _build(_use(p, f"{where}.policies[{i}]"), _args(p), f"{where}.policies[{i}]", counter)
            for i, p in enumerate(nested)
        ]
    if counter is not None and "counter" not in args and _accepts(factory, "counter"):
        args["counter"] = counter  # count with the command's tokenizer unless told otherwise
    try:
        return factory(**args)
    except (ConfigError, TypeError, ValueError) as exc:
        raise StackError(f"{where} ({name}): {exc}") from None


def _accepts(factory: Any, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _use(table: Any, where: str) -> str:
    if not isinstance(table, dict) or not isinstance(table.get("use"), str):
        raise StackError(f"{where}: each entry needs a string 'use' naming a layer")
    name: str = table["use"]
    return name


def _args(table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if k != "use"}


def load_stack(spec: str, *, counter: TokenCounter | None = None) -> list[LayerLike]:
    """A stack by name (``default``, ``seed-order``, any ``tinyctx.stacks`` entry point) or
    from a TOML file: ``[[layers]]`` tables with ``use = "<layer name>"`` and arguments."""
    stacks = _entry_points("tinyctx.stacks")
    if spec in stacks:
        factory: StackFactory = stacks[spec].load()
        named = list(factory(counter=counter))
        _check_order(named, f"--stack {spec}")
        return named
    path = Path(spec)
    if not path.is_file():
        known = ", ".join(sorted(stacks)) or "none installed"
        raise StackError(f"--stack {spec!r}: not a stack name ({known}) and no such file")
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise StackError(f"{path}: invalid TOML: {exc}") from None
    unknown = set(document) - {"layers"}
    if unknown:
        raise StackError(f"{path}: unknown top-level keys {sorted(unknown)}; expected [[layers]]")
    tables = document.get("layers")
    if not isinstance(tables, list) or not tables:
        raise StackError(f"{path}: expected one or more [[layers]] tables")
    stack = [
        _build(_use(t, f"{path}: layers[{i}]"), _args(t), f"{path}: layers[{i}]", counter)
        for i, t in enumerate(tables)
    ]
    _check_order(stack, str(path))
    return stack


def load_stack_at(
    spec: str,
    low_water: float,
    *,
    counter: TokenCounter | None = None,
    relief_run: int | None = None,
) -> list[LayerLike]:
    """``spec`` with its budget guard's low-water mark set to ``low_water`` (for sweeps): a
    named stack whose factory takes ``low_water``, or a TOML file whose ``budget_guard``
    layers get ``low_water`` (replacing any ``target``/``low_water`` they set). A
    ``relief_run`` other than None replaces the guard's relief run the same way."""
    stacks = _entry_points("tinyctx.stacks")
    if spec in stacks:
        factory: StackFactory = stacks[spec].load()
        if not _accepts(factory, "low_water"):
            raise StackError(f"--sweep: stack {spec!r} has no low_water knob to sweep")
        if relief_run is None:
            return list(factory(counter=counter, low_water=low_water))
        if not _accepts(factory, "relief_run"):
            raise StackError(f"--sweep: stack {spec!r} has no relief_run to set")
        return list(factory(counter=counter, low_water=low_water, relief_run=relief_run))
    path = Path(spec)
    load_stack(spec, counter=counter)  # the file, validated as it is
    tables = tomllib.loads(path.read_text(encoding="utf-8"))["layers"]
    if not any(t.get("use") == "budget_guard" for t in tables):
        raise StackError(f"--sweep: {path} has no budget_guard layer whose low_water to sweep")
    for t in tables:
        if t.get("use") == "budget_guard":
            t.pop("target", None)
            t["low_water"] = low_water
            if relief_run is not None:
                t["relief_run"] = relief_run
    return [
        _build(_use(t, f"{path}: layers[{i}]"), _args(t), f"{path}: layers[{i}]", counter)
        for i, t in enumerate(tables)
    ]


def _check_order(stack: Sequence[LayerLike], where: str) -> None:
    """Declared ordering rules are checked before anything replays (never reordered)."""
    try:
        check_ordering(stack)
    except OrderingError as exc:
        raise StackError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------------
# transcripts


def bundled_transcript() -> Path:
    """The real transcript shipped with the package (license beside it)."""
    return Path(str(resources.files("tinyctx") / "data" / BUNDLED))


def _load(source: str, io: _IO, fmt: str | None, record: int) -> tuple[Message, ...]:
    from .formats import parse_transcript

    stdin = io.stdin
    if source == "-":
        name, text = "<stdin>", stdin.read()
    else:
        path = Path(source)
        if path.is_dir():
            _fail(f"{source}: is a directory; give a transcript file", EXIT_INPUT)
        if not path.exists():
            _fail(f"{source}: no such file", EXIT_INPUT)
        try:
            name, text = source, path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            _fail(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})", EXIT_INPUT)
        except OSError as exc:
            _fail(f"{source}: cannot read: {exc.strerror or exc}", EXIT_INPUT)
    try:
        transcript = parse_transcript(text, format=fmt, path=name, record=record)  # type: ignore[arg-type]
    except (TinyCtxError, ValueError) as exc:
        message = str(exc)
        _fail(message if name in message else f"{name}: {message}", EXIT_INPUT)
    records = transcript.info.get("records")
    if isinstance(records, int) and records > 1:
        io.note(f"{name} holds {records} runs; reading run {record} (--record N picks another)")
    return transcript.messages


def _looks_like_path(text: str) -> bool:
    """A file path rather than a hub name (``org/name`` or ``name``)."""
    return (
        text.startswith(("/", ".", "~"))
        or text.count("/") > 1  # a hub name has at most one
        or "\\" in text
        or text.lower().endswith((".json", ".jsonl", ".traj"))
    )


def _hub_cache(name: str) -> Path | None:
    """The tokenizer.json of ``name`` in the local Hugging Face cache, if downloaded."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    cache = Path(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))
    snapshots = cache / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_reachable() -> str | None:
    """None when the hub answers a TCP connect within :data:`HUB_TIMEOUT`, else why not."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_TIMEOUT):
            return None
    except OSError as exc:
        return f"cannot reach {host}:{port} ({exc.strerror or type(exc).__name__})"


def _counter(spec: str | None) -> TokenCounter:
    if spec is None:
        return default_counter()
    from .tokens import TokenizersCounter

    flag = f"--tokenizer {spec}"
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            _fail(f"{flag}: a directory without tokenizer.json", EXIT_TOKENIZER)
    if not path.is_file():
        if _looks_like_path(spec):
            _fail(f"{flag}: no such file", EXIT_TOKENIZER)
        path = _hub_cache(spec) or path
    try:
        if path.is_file():
            return TokenizersCounter.from_file(path)
    except Exception as exc:
        _fail(f"{flag}: not a tokenizers JSON file: {exc}", EXIT_TOKENIZER)
    hint = "pass the path of a tokenizer.json, or download it once while online"
    if _offline():
        _fail(
            f"{flag}: not in the local hub cache and HF_HUB_OFFLINE is set; {hint}", EXIT_TOKENIZER
        )
    unreachable = _hub_reachable()
    if unreachable is not None:
        _fail(
            f"{flag}: {unreachable}; check the connection, {hint}, or set HF_HUB_OFFLINE=1 "
            "to use only the local cache",
            EXIT_TOKENIZER,
        )
    try:
        return TokenizersCounter.from_pretrained(spec)
    except Exception as exc:
        _fail(f"{flag}: cannot load from the hub: {exc}", EXIT_TOKENIZER)


def _price(args: argparse.Namespace, io: _IO) -> Any:
    """The ModelPrice asked for with --price / --prices, or None (no cost shown). A
    ``--sweep`` without either prices at :data:`~tinyctx.cost.DEFAULT_PRICE`, and says so."""
    from .cost import DEFAULT_PRICE, PRICES, load_price_table, price_for

    if args.price is None and args.prices is None and args.sweep is None:
        return None
    table = None
    if args.prices is not None:
        try:
            table = load_price_table(args.prices)
        except ConfigError as exc:
            _fail(f"--prices {args.prices}: {exc}", EXIT_INPUT)
    name = args.price
    if name is None:
        if table is not None and len(table) == 1:
            return next(iter(table.values()))
        if table is not None:
            _fail(f"--prices {args.prices}: several models ({', '.join(table)}); choose --price")
        name = DEFAULT_PRICE
        io.note(f"--sweep: pricing at {name} (choose the model with --price MODEL)")
    try:
        return price_for(name, table)
    except ConfigError:
        known = ", ".join(sorted(PRICES if table is None else table))
        where = f"in --prices {args.prices}" if table is not None else "built in"
        _fail(f"--price {name}: not a known model; the models {where}: {known}")


DEFAULT_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def _relief_run(stack: Sequence[LayerLike]) -> int:
    """The relief run of the stack's budget guard (0 when it has none, or it is off)."""
    runs = [getattr(layer, "relief_run", 0) for layer in stack]
    return max((r for r in runs if isinstance(r, int) and not isinstance(r, bool)), default=0)


def _swept_stacks(
    spec: str, stack: Sequence[LayerLike], values: Sequence[float], counter: TokenCounter
) -> list[tuple[str | None, list[list[LayerLike]]]]:
    """The stacks a sweep replays, by series. A guard with a relief run (``default_stack``:
    20) goes deeper than the mark when the conversation grows fast, so above some mark
    every setting keeps the same context: the sweep then replays each mark without the run
    too, and the curve reaches every context the stack can keep."""
    run = _relief_run(stack)
    own = [load_stack_at(spec, v, counter=counter) for v in values]
    if not values or not run:
        return [(None, own)]
    off = [load_stack_at(spec, v, counter=counter, relief_run=0) for v in values]
    return [(f"relief_run={run}", own), ("relief_run=0", off)]


def _sweep_payload(
    transcript: Sequence[Message],
    swept: list[tuple[str | None, list[list[LayerLike]]]],
    values: Sequence[float],
    price: ModelPrice,
    window: int | None,
    reserve: int,
    counter: TokenCounter,
    err: TextIO,
) -> dict[str, Any]:
    """``--sweep``'s points, each series in turn, each marked whether it is on the frontier
    (no other point keeps as much context for less: the settings worth picking). On a
    terminal a bar counts its replays (one per value and series)."""
    from .cost import frontier, lost_frontier, sweep

    points: list[SweepPoint] = []
    total = sum(len(stacks) for _, stacks in swept)
    with _progress(err, total, "sweeping", "replays") as progress:
        for series, stacks in swept:
            for value, stack in zip(values, stacks, strict=True):  # a fresh stack per value
                points += sweep(
                    transcript,
                    lambda _value, stack=stack: stack,  # type: ignore[misc]
                    [value],
                    price=price,
                    window=window,
                    reserved=reserve,
                    counter=counter,
                    series=series,
                )
                if progress is not None:
                    progress(len(points), total)
    best = {id(p) for p in frontier(points)}
    forgets_least = {id(p) for p in lost_frontier(points)}
    return {
        "knob": "low_water",
        "points": [
            {**p.to_json(), "frontier": id(p) in best, "lost_frontier": id(p) in forgets_least}
            for p in points
        ],
    }


def _sweep_values(text: str) -> tuple[float, ...]:
    if text == "default":
        return DEFAULT_SWEEP
    values: list[float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            _fail(f"--sweep {text!r}: {item!r} is not a number (e.g. 0.2,0.4,0.6)")
        if not 0 < value <= 1:
            _fail(f"--sweep {text!r}: {value} is not a low-water fraction in (0, 1]")
        values.append(value)
    return tuple(values)


def _plot_path(spec: str) -> Path:
    """``--plot``'s file, checked before the replay so a long run never ends in an error."""
    path = Path(spec)
    if path.is_dir():
        example = path / "chart.svg"
        _fail(f"--plot {spec}: is a directory; give a file name such as {example}", EXIT_OUTPUT)
    if path.suffix.lower() != ".svg":
        _fail(
            f"--plot {spec}: the chart is SVG, name the file .svg "
            "(render a PNG with `rsvg-convert chart.svg -o chart.png`)",
            EXIT_OUTPUT,
        )
    parent = path.parent
    if not parent.is_dir():
        _fail(f"--plot {spec}: no such directory {str(parent)!r}", EXIT_OUTPUT)
    if not os.access(parent, os.W_OK):
        _fail(f"--plot {spec}: directory {str(parent)!r} is not writable", EXIT_OUTPUT)
    return path


# ---------------------------------------------------------------------------------------
# commands


@contextmanager
def _progress(
    err: TextIO, total: int | None = None, what: str = "replaying", unit: str = "messages"
) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr (``what done/total unit``), only on a terminal, cleared
    when the work ends. Given the total, it shows it from the start, never ``0/?``."""
    if not err.isatty():
        yield None
        return
    from .render import console  # first: it names the extra when rich is missing

    # isort: split
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        console=console(err, stderr=True),
        transient=True,
    )
    task = bar.add_task(what, total=total)

    def show(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield show


def _table_cells(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with the table's combined cells per call: ``lost_of_uses`` ("lost/uses")
    and, when the transcript has images, ``imgs`` ("sent/recorded"; a text-only replay
    shows no such column)."""
    images = any(call["raw_images"] for call in payload["calls"])
    cells = []
    for call in payload["calls"]:
        cell = {**call, "lost_of_uses": f"{call['lost_uses']}/{call['uses']}"}
        if images:
            cell["imgs"] = f"{call['images']}/{call['raw_images']}"
        cells.append(cell)
    return {**payload, "calls": cells}


def _cmd_replay(args: argparse.Namespace, io: _IO) -> int:
    from .chart import write_chart
    from .render import console, print_replay, replayed
    from .replay import replay_sync

    source = args.transcript or str(bundled_transcript())
    if args.window <= 0:
        _fail(f"--window {args.window}: must be > 0")
    reserve = default_reserve(args.window) if args.reserve is None else args.reserve
    if reserve < 0 or reserve >= args.window:
        _fail(f"--reserve {reserve}: must be >= 0 and below --window ({args.window})")
    plot = _plot_path(args.plot) if args.plot else None
    transcript = _load(source, io, args.format, args.record)
    name = "<stdin>" if source == "-" else Path(source).name
    if not transcript:
        _fail(f"{source}: the transcript holds no messages; nothing to replay", EXIT_EMPTY)
    if not any(isinstance(m, AssistantMessage) for m in transcript):
        _fail(f"{source}: the transcript holds no model answer; nothing to replay", EXIT_EMPTY)
    counter = _counter(args.tokenizer)
    price = _price(args, io)
    values = _sweep_values(args.sweep) if args.sweep is not None else ()
    try:
        stack = load_stack(args.stack, counter=counter)
        swept = _swept_stacks(args.stack, stack, values, counter)
    except StackError as exc:
        _fail(str(exc))
    try:
        with _progress(io.err, len(transcript)) as progress:
            report = replay_sync(
                transcript,
                stack,
                window=args.window,
                reserved=reserve,
                counter=counter,
                progress=progress,
            )
    except TinyCtxError as exc:  # a recording the kernel refuses (e.g. an unpaired tool call)
        _fail(f"{source}: cannot replay: {exc}", EXIT_INPUT)
    if report.error and not report.rows and not args.json:
        _fail(
            f"--window {args.window}: no model call was replayed, the first prompt does not "
            f"fit ({report.error}); choose a larger --window (default: {DEFAULT_WINDOW})",
            EXIT_STOPPED,
        )
    payload = report.to_json()
    payload["transcript"] = "-" if source == "-" else source
    payload["stack"] = args.stack
    # extra per-call data (cost, ...): enrich payload["calls"][i] / payload["summary"] here
    if price is not None:
        from .cost import add_to_payload

        add_to_payload(payload, report.cost(price))
    if values:
        payload["sweep"] = _sweep_payload(
            transcript, swept, values, price, args.window, reserve, counter, io.err
        )
    if args.json:
        json.dump(payload, io.out, indent=2)
        io.out.write("\n")
    else:
        print_replay(_table_cells(payload), console(io.out), name)
    io.out.flush()
    if plot is not None:
        write_chart(payload, plot, name, stack=args.stack)
        io.note(f"chart written to {plot}")
    if report.error:
        io.note(f"stopped: {report.error}")
        io.note(f"{replayed(payload['summary'])} model calls replayed")
        return EXIT_STOPPED
    return EXIT_OK


def _cmd_stats(args: argparse.Namespace, io: _IO) -> int:
    from .render import console, print_stats

    if args.transcript is None:  # like replay: the bundled session
        args.transcript = str(bundled_transcript())
    transcript = _load(args.transcript, io, args.format, args.record)
    if not transcript:
        _fail(f"{args.transcript}: the transcript holds no messages", EXIT_EMPTY)
    heuristic = default_counter()
    real = _counter(args.tokenizer) if args.tokenizer else None
    by_role: Counter[str] = Counter()
    by_role_real: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    tool_calls: Counter[str] = Counter()
    names: dict[str, str] = {}
    results: list[tuple[int, str, str]] = []
    media: Counter[str] = Counter()
    for message in transcript:
        tokens = heuristic.count_message(message)
        for part in message.parts:
            if part.kind != "text":
                media[f"{part.kind}s"] += 1
                media["media_tokens"] += heuristic.count_media((part,))
        by_role[message.role] += tokens
        if real is not None:
            by_role_real[message.role] += real.count_message(message)
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                names[call.id] = call.name
                tool_calls[call.name] += 1
        elif isinstance(message, ToolResult):
            tool = message.name or names.get(message.tool_call_id, "?")
            by_tool[tool] += tokens
            results.append((tokens, tool, message.tool_call_id))
    largest = sorted(results, reverse=True)[:5]
    payload = {
        "transcript": args.transcript,
        "messages": len(transcript),
        "user_turns": sum(1 for m in transcript if m.role == "user"),
        "model_turns": sum(1 for m in transcript if m.role == "assistant"),
        "tool_calls": sum(tool_calls.values()),
        "tokens_by_role": dict(by_role.most_common()),
        "tokens_by_role_tokenizer": dict(by_role_real) if real is not None else None,
        "tool_result_tokens_by_tool": dict(by_tool.most_common()),
        "calls_by_tool": dict(tool_calls.most_common()),
        "largest_tool_results": [
            {"tokens": t, "tool": n, "tool_call_id": i} for t, n, i in largest
        ],
        "images": media["images"],
        "documents": media["documents"],
        "media_tokens": media["media_tokens"],
    }
    if args.json:
        json.dump(payload, io.out, indent=2)
        io.out.write("\n")
    else:
        name = "<stdin>" if args.transcript == "-" else Path(args.transcript).name
        print_stats(payload, console(io.out), name)
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# the command line


class _IO:
    """The command's streams (the process's, or a test's)."""

    def __init__(self, out: TextIO, err: TextIO, stdin: IO[str]) -> None:
        self.out, self.err, self.stdin = out, err, stdin

    def note(self, text: str) -> None:
        print(f"tinyctx: {text}", file=self.err)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse writing to the command's streams and returning instead of exiting."""

    io: _IO

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (self.io.err if file is sys.stderr else self.io.out).write(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self.io.err.write(message)
        raise _Exit(status)


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default, unless its text already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default:" in text or default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: {default})"


def _formats_epilog() -> str:
    lines = ["transcript formats (detected; --format NAME to choose):"]
    lines += [f"  {name:<15} {text}" for name, text in FORMAT_HELP.items()]
    return "\n".join(lines)


def _exit_epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def _version() -> str:
    try:
        return metadata.version("tinyctx")
    except metadata.PackageNotFoundError:  # pragma: no cover - always installed
        return "unknown"


def _new(prog: str, description: str, epilog: str, io: _IO) -> _Parser:
    parser = _Parser(prog=prog, description=description, epilog=epilog, formatter_class=_Help)
    parser.io = io
    return parser


def _add_input(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=sorted(FORMAT_HELP),
        metavar="NAME",
        default=None,
        help="the transcript's format (default: detected from the content)",
    )
    parser.add_argument(
        "--record",
        type=int,
        default=0,
        metavar="N",
        help="which trajectory of a file holding several (OpenHands, tau-bench), from 0",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="FILE|HUB-NAME",
        help="count with a tokenizers JSON file or a Hugging Face hub model "
        "(default: the built-in heuristic)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (fields: docs/cli.md)")


def _replay_parser(io: _IO) -> _Parser:
    parser = _new(
        "tinyctx replay",
        "Replay a transcript through a stack of layers and show, per model call, what the\n"
        "model was sent, what the recording would have cost without the stack, and what\n"
        "each layer did.",
        _formats_epilog() + "\n\n" + _exit_epilog(),
        io,
    )
    parser.add_argument(
        "transcript",
        nargs="?",
        help="the transcript file, or - to read it from stdin "
        f"(default: the bundled Claude Code session {BUNDLED})",
    )
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, metavar="N", help="context window in tokens"
    )
    parser.add_argument(
        "--reserve",
        type=int,
        default=None,
        metavar="N",
        help=f"tokens reserved for the answer (default: window/8, at most {MAX_DEFAULT_RESERVE})",
    )
    parser.add_argument(
        "--stack",
        default="default",
        metavar="NAME|FILE",
        help="a stack by name (default, seed-order, or an installed one) or a TOML file",
    )
    _add_input(parser)
    parser.add_argument(
        "--plot", metavar="FILE.svg", help="also write an SVG chart of the prompt size per call"
    )
    parser.add_argument(
        "--price",
        metavar="MODEL",
        help="price every call with prompt caching at MODEL's prices (claude-sonnet-4-5, "
        "gpt-4o, ...: tinyctx.cost.PRICES); adds cache and cost columns",
    )
    parser.add_argument(
        "--prices",
        metavar="FILE.toml",
        help="your own price table: [models.NAME] input, output, cache_write, cache_read, "
        "caching, min_cacheable, cache_granularity, window",
    )
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="default",
        metavar="VALUES",
        help="also replay at each low-water mark (default 0.1,...,0.8) and show average "
        "prompt tokens and the lost rate against cost (a table, and panels of --plot)",
    )
    return parser


def _stats_parser(io: _IO) -> _Parser:
    parser = _new(
        "tinyctx stats",
        "Count a transcript's messages, turns and tokens by role and by tool.",
        _formats_epilog() + "\n\n" + _exit_epilog(),
        io,
    )
    parser.add_argument(
        "transcript",
        nargs="?",
        help="the transcript file, or - to read it from stdin "
        f"(default: the bundled Claude Code session {BUNDLED})",
    )
    _add_input(parser)
    return parser


def _top_parser(io: _IO) -> _Parser:
    parser = _new(
        "tinyctx",
        "Replay real agent transcripts through tinyctx layer stacks.\n\n"
        "commands:\n"
        "  replay [TRANSCRIPT|-] [options]   replay through a stack (the default command)\n"
        "  stats [TRANSCRIPT|-] [options]    tokens by role and tool\n\n"
        "`tinyctx COMMAND --help` shows a command's options.",
        _formats_epilog() + "\n\n" + _exit_epilog(),
        io,
    )
    parser.add_argument("--version", action="version", version=f"tinyctx {_version()}")
    return parser


def _unknown_command(word: str) -> str | None:
    """Why ``word`` is not a transcript but a mistyped command, or None."""
    if word == "-" or word.startswith("-") or Path(word).exists() or _looks_like_path(word):
        return None
    if "." in word or "/" in word:
        return None  # a missing file: reported as such when loading
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown command {word!r} (commands: {', '.join(COMMANDS)}; or a transcript file){hint}"


def _run(argv: list[str], io: _IO) -> int:
    top = _top_parser(io)
    if argv and argv[0] in ("-h", "--help", "--version"):
        top.parse_args(argv[:1])
    if argv and argv[0] in COMMANDS:
        command, rest = argv[0], argv[1:]
    else:
        mistake = _unknown_command(argv[0]) if argv else None
        if mistake is not None:
            top.print_usage(io.err)
            _fail(mistake)
        command, rest = "replay", argv
    if command == "stats":
        return _cmd_stats(_stats_parser(io).parse_args(rest), io)
    return _cmd_replay(_replay_parser(io).parse_args(rest), io)


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test's stream)
        pass


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: IO[str] | None = None,
) -> int:
    """Run the command; returns the exit code (see :data:`EXIT_CODES`)."""
    io = _IO(out or sys.stdout, err or sys.stderr, stdin or sys.stdin)
    try:
        return _run(list(sys.argv[1:] if argv is None else argv), io)
    except _Exit as exit_:
        return exit_.code
    except CommandError as exc:
        io.note(f"error: {exc}")
        return exc.code
    except BrokenPipeError:
        if out is None:
            _quiet_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        io.note("interrupted")
        return EXIT_INTERRUPTED
