"""The ``tinyctx`` command: replay a real transcript through a stack of layers.

    tinyctx                      replay the bundled transcript through the default stack
    tinyctx replay [TRANSCRIPT] [--window N] [--reserve N] [--stack default|seed-order|FILE]
                   [--tokenizer PATH] [--json] [--plot FILE]
    tinyctx stats TRANSCRIPT [--tokenizer PATH] [--json]

Stacks and layers are found by name through entry points (``tinyctx.stacks`` and
``tinyctx.layers``), so the kernel knows no concrete layer and an application can register
its own layers for ``--stack FILE``. Bad input exits with code 2 and names the file and
the line or index; a replay the stack could not keep inside the window stops there and
exits with code 1.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .chain import LayerLike
from .errors import ConfigError, TinyCtxError
from .messages import AssistantMessage, Message, ToolResult
from .ordering import OrderingError, check_ordering
from .tokens import TokenCounter, default_counter

__all__ = ["main", "load_stack", "StackError", "bundled_transcript"]

DEFAULT_WINDOW = 32_000
DEFAULT_RESERVE = 4_000
BUNDLED = "marot__spotter__cc-main-4d5611e5.jsonl"


class StackError(TinyCtxError, ValueError):
    """A stack file or name that cannot be built; the message names the file and place."""


class UsageError(Exception):
    """Bad command-line input: printed and exit code 2."""


def _fail(message: str) -> NoReturn:
    raise UsageError(message)


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


def _load(path: Path) -> tuple[Message, ...]:
    from .formats import load_transcript

    if not path.is_file():
        _fail(f"{path}: no such file")
    try:
        return tuple(load_transcript(path))
    except (TinyCtxError, ValueError) as exc:
        text = str(exc)
        _fail(text if str(path) in text else f"{path}: {text}")


def _counter(tokenizer: str | None) -> TokenCounter:
    if tokenizer is None:
        return default_counter()
    from .tokens import TokenizersCounter

    path = Path(tokenizer)
    try:
        if path.is_file():
            return TokenizersCounter.from_file(path)
        return TokenizersCounter.from_pretrained(tokenizer)
    except Exception as exc:
        _fail(f"--tokenizer {tokenizer}: cannot load: {exc}")


# ---------------------------------------------------------------------------------------
# output


def _progress(stream: TextIO) -> Callable[[int, int], None] | None:
    if not stream.isatty():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} messages")
        stream.flush()
        if done >= total:
            stream.write("\n")

    return show


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{value * 100:5.1f}%"


def _print_replay(report: Any, out: TextIO, source: str) -> None:
    print(f"replay of {source}", file=out)
    usable = report.usable
    print(
        f"window {report.window} - reserved {report.reserved} = usable {usable} tokens\n",
        file=out,
    )
    print(
        f"{'call':>4} {'msgs':>5} {'tokens':>8} {'util':>7} {'raw':>8} {'saved':>7}  actions",
        file=out,
    )
    for row in report.rows:
        actions = "; ".join(row.actions) if row.actions else ""
        flag = " !" if row.would_overflow else "  "
        print(
            f"{row.index:>4} {row.messages:>5} {row.tokens:>8} {_pct(row.utilisation):>7} "
            f"{row.raw_tokens:>8}{flag}{row.saved:>6}  {actions}",
            file=out,
        )
    s = report.to_json()["summary"]
    print("", file=out)
    print(f"model calls:                       {s['model_calls']}", file=out)
    print(f"peak utilisation:                  {_pct(s['peak_utilisation']).strip()}", file=out)
    print(f"calls that would overflow (!):     {s['would_overflow_without_stack']}", file=out)
    print(f"  kept in the window by the stack: {s['overflows_avoided']}", file=out)
    print(f"tokens saved over all calls:       {s['total_tokens_saved']}", file=out)
    if s["error"]:
        print(f"stopped: {s['error']}", file=out)


def write_svg(report: Any, path: Path) -> None:
    """A dependency-free SVG chart: utilisation per call, raw vs sent, actions marked."""
    rows = report.rows
    width, height, pad = 900, 360, 48
    n = max(len(rows), 1)
    top = max([1.0, *(r.raw_utilisation or 0 for r in rows)])

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (v / top)

    def line(values: list[float], color: str, dash: str = "") -> str:
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline fill="none" stroke="{color}" stroke-width="2"{extra} points="{points}"/>'

    bottom = height - pad
    sent = [r.utilisation or 0.0 for r in rows]
    raw = [r.raw_utilisation or 0.0 for r in rows]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{pad}" y1="{y(1.0):.1f}" x2="{width - pad}" y2="{y(1.0):.1f}" stroke="#c00"/>',
        f'<text x="{width - pad}" y="{y(1.0) - 4:.1f}" text-anchor="end" fill="#c00">window</text>',
        f'<line x1="{pad}" y1="{bottom}" x2="{width - pad}" y2="{bottom}" stroke="#333"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{bottom}" stroke="#333"/>',
        line(raw, "#999", "4 3"),
        line(sent, "#1f6fb2"),
    ]
    for i, r in enumerate(rows):
        if r.actions:
            title = "; ".join(r.actions).replace("&", "&amp;").replace("<", "&lt;")
            parts.append(
                f'<circle cx="{x(i):.1f}" cy="{y(r.utilisation or 0):.1f}" r="4" fill="#e08a00">'
                f"<title>call {r.index}: {title}</title></circle>"
            )
    parts += [
        f'<text x="{pad}" y="{pad - 16}">utilisation per model call (blue: sent, grey: without the '
        "stack, orange: a layer acted)</text>",
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">'
        f"model call (1..{len(rows)})</text>",
        "</svg>",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")


# ---------------------------------------------------------------------------------------
# commands


def _cmd_replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .replay import replay_sync

    path = Path(args.transcript) if args.transcript else bundled_transcript()
    if args.window is not None and args.window <= 0:
        _fail(f"--window {args.window}: must be > 0")
    if args.reserve < 0 or (args.window is not None and args.reserve >= args.window):
        _fail(f"--reserve {args.reserve}: must be >= 0 and below --window ({args.window})")
    transcript = _load(path)
    counter = _counter(args.tokenizer)
    try:
        stack = load_stack(args.stack, counter=counter)
    except StackError as exc:
        _fail(str(exc))
    report = replay_sync(
        transcript,
        stack,
        window=args.window,
        reserved=args.reserve,
        counter=counter,
        progress=_progress(err),
    )
    if args.json:
        payload = report.to_json()
        payload["transcript"] = str(path)
        payload["stack"] = args.stack
        json.dump(payload, out, indent=2)
        out.write("\n")
    else:
        _print_replay(report, out, path.name)
    if args.plot:
        write_svg(report, Path(args.plot))
        print(f"chart written to {args.plot}", file=err)
    # 1: the stack could not keep the transcript in the window (2 is for bad input)
    return 1 if report.error else 0


def _cmd_stats(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = Path(args.transcript)
    transcript = _load(path)
    heuristic = default_counter()
    real = _counter(args.tokenizer) if args.tokenizer else None
    by_role: Counter[str] = Counter()
    by_role_real: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    tool_calls: Counter[str] = Counter()
    names: dict[str, str] = {}
    results: list[tuple[int, str, str]] = []
    for message in transcript:
        tokens = heuristic.count_message(message)
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
    turns = sum(1 for m in transcript if m.role == "user")
    largest = sorted(results, reverse=True)[:5]
    payload = {
        "transcript": str(path),
        "messages": len(transcript),
        "user_turns": turns,
        "model_turns": sum(1 for m in transcript if m.role == "assistant"),
        "tool_calls": sum(tool_calls.values()),
        "tokens_by_role": dict(by_role),
        "tokens_by_role_tokenizer": dict(by_role_real) if real is not None else None,
        "tool_result_tokens_by_tool": dict(by_tool.most_common()),
        "calls_by_tool": dict(tool_calls.most_common()),
        "largest_tool_results": [
            {"tokens": t, "tool": n, "tool_call_id": i} for t, n, i in largest
        ],
    }
    if args.json:
        json.dump(payload, out, indent=2)
        out.write("\n")
        return 0
    print(
        f"{path.name}: {len(transcript)} messages, {turns} user turns, "
        f"{payload['model_turns']} model turns, {payload['tool_calls']} tool calls",
        file=out,
    )
    print("\ntokens by role (heuristic" + (" / tokenizer)" if real else ")"), file=out)
    for role, tokens in by_role.most_common():
        extra = f" / {by_role_real[role]:>8}" if real is not None else ""
        print(f"  {role:<10} {tokens:>8}{extra}", file=out)
    if real is not None:
        total_h, total_r = sum(by_role.values()), sum(by_role_real.values())
        err_pct = (total_h - total_r) / total_r * 100 if total_r else 0.0
        print(f"  {'total':<10} {total_h:>8} / {total_r:>8}  (heuristic {err_pct:+.1f}%)", file=out)
    print("\ntool results by tool (tokens, calls)", file=out)
    for tool, tokens in by_tool.most_common():
        print(f"  {tool:<20} {tokens:>8} {tool_calls[tool]:>5}", file=out)
    print("\nlargest tool results", file=out)
    for tokens, tool, call_id in largest:
        print(f"  {tokens:>8}  {tool}  ({call_id})", file=out)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tinyctx",
        description="Replay real agent transcripts through tinyctx layer stacks.",
    )
    sub = parser.add_subparsers(dest="command")
    rp = sub.add_parser("replay", help="replay a transcript through a stack (the default command)")
    rp.add_argument(
        "transcript", nargs="?", help="OpenAI JSON/JSONL, Anthropic JSON, SWE-agent traj"
    )
    rp.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="context window in tokens")
    rp.add_argument(
        "--reserve", type=int, default=DEFAULT_RESERVE, help="tokens reserved for output"
    )
    rp.add_argument("--stack", default="default", help="default, seed-order, or a TOML file")
    rp.add_argument("--tokenizer", help="a tokenizers JSON file or hub name (default: heuristic)")
    rp.add_argument("--json", action="store_true", help="machine-readable output")
    rp.add_argument("--plot", help="write an SVG chart of utilisation per call")
    st = sub.add_parser("stats", help="token counts per role and tool of a transcript")
    st.add_argument("transcript")
    st.add_argument("--tokenizer", help="also count with this tokenizer")
    st.add_argument("--json", action="store_true")
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("replay", "stats", "-h", "--help"):
        argv = ["replay", *argv]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        if args.command == "stats":
            return _cmd_stats(args, out, err)
        return _cmd_replay(args, out, err)
    except UsageError as exc:
        print(f"tinyctx: error: {exc}", file=err)
        return 2
    except TinyCtxError as exc:
        print(f"tinyctx: error: {exc}", file=err)
        return 2
