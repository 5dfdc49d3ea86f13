"""What the command reads: transcripts, tokenizers, prices, sweep values, the plot's path."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlparse

from ..chain import LayerLike
from ..errors import ConfigError, TinyCtxError
from ..messages import Message
from ..tokens import TokenCounter, default_counter

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    from ..cost import ModelPrice, SweepPoint
from ._common import (
    BUNDLED,
    EXIT_INPUT,
    EXIT_OUTPUT,
    EXIT_TOKENIZER,
    HUB_TIMEOUT,
    Streams,
    fail,
    progress_bar,
)
from ._stacks import load_stack_at


def bundled_transcript() -> Path:
    """The real transcript shipped with the package (license beside it)."""
    return Path(str(resources.files("tinyctx") / "data" / BUNDLED))


def load_transcript(source: str, io: Streams, fmt: str | None, record: int) -> tuple[Message, ...]:
    """The messages of a transcript file (``-``: stdin); a failure is the command's.

    Args:
        source: The file's path, or ``-``.
        io: The command's streams (stdin, and stderr for a note).
        fmt: The format's name (``--format``), or None to detect it.
        record: Which run of a file holding several to read.
    """
    from ..formats import parse_transcript

    stdin = io.stdin
    if source == "-":
        name, text = "<stdin>", stdin.read()
    else:
        path = Path(source)
        if path.is_dir():
            fail(f"{source}: is a directory; give a transcript file", EXIT_INPUT)
        if not path.exists():
            fail(f"{source}: no such file", EXIT_INPUT)
        try:
            name, text = source, path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            fail(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})", EXIT_INPUT)
        except OSError as exc:
            fail(f"{source}: cannot read: {exc.strerror or exc}", EXIT_INPUT)
    try:
        transcript = parse_transcript(text, format=fmt, path=name, record=record)  # type: ignore[arg-type]
    except (TinyCtxError, ValueError) as exc:
        message = str(exc)
        fail(message if name in message else f"{name}: {message}", EXIT_INPUT)
    records = transcript.info.get("records")
    if isinstance(records, int) and records > 1:
        io.note(f"{name} holds {records} runs; reading run {record} (--record N picks another)")
    return transcript.messages


def looks_like_path(text: str) -> bool:
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


def counter_for(spec: str | None) -> TokenCounter:
    if spec is None:
        return default_counter()
    from ..tokens import TokenizersCounter

    flag = f"--tokenizer {spec}"
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            fail(f"{flag}: a directory without tokenizer.json", EXIT_TOKENIZER)
    if not path.is_file():
        if looks_like_path(spec):
            fail(f"{flag}: no such file", EXIT_TOKENIZER)
        path = _hub_cache(spec) or path
    try:
        if path.is_file():
            return TokenizersCounter.from_file(path)
    except Exception as exc:
        fail(f"{flag}: not a tokenizers JSON file: {exc}", EXIT_TOKENIZER)
    hint = "pass the path of a tokenizer.json, or download it once while online"
    if _offline():
        fail(
            f"{flag}: not in the local hub cache and HF_HUB_OFFLINE is set; {hint}", EXIT_TOKENIZER
        )
    unreachable = _hub_reachable()
    if unreachable is not None:
        fail(
            f"{flag}: {unreachable}; check the connection, {hint}, or set HF_HUB_OFFLINE=1 "
            "to use only the local cache",
            EXIT_TOKENIZER,
        )
    try:
        return TokenizersCounter.from_pretrained(spec)
    except Exception as exc:
        fail(f"{flag}: cannot load from the hub: {exc}", EXIT_TOKENIZER)


def price_asked(args: argparse.Namespace, io: Streams) -> Any:
    """The ModelPrice asked for with --price / --prices, or None (no cost shown). A
    ``--sweep`` without either prices at :data:`~tinyctx.cost.DEFAULT_PRICE`, and says so."""
    from ..cost import DEFAULT_PRICE, PRICES, load_price_table, price_for

    if args.price is None and args.prices is None and args.sweep is None:
        return None
    table = None
    if args.prices is not None:
        try:
            table = load_price_table(args.prices)
        except ConfigError as exc:
            fail(f"--prices {args.prices}: {exc}", EXIT_INPUT)
    name = args.price
    if name is None:
        if table is not None and len(table) == 1:
            return next(iter(table.values()))
        if table is not None:
            fail(f"--prices {args.prices}: several models ({', '.join(table)}); choose --price")
        name = DEFAULT_PRICE
        io.note(f"--sweep: pricing at {name} (choose the model with --price MODEL)")
    try:
        return price_for(name, table)
    except ConfigError:
        known = ", ".join(sorted(PRICES if table is None else table))
        where = f"in --prices {args.prices}" if table is not None else "built in"
        fail(f"--price {name}: not a known model; the models {where}: {known}")


DEFAULT_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def _relief_run(stack: Sequence[LayerLike]) -> int:
    """The relief run of the stack's budget guard (0 when it has none, or it is off)."""
    runs = [getattr(layer, "relief_run", 0) for layer in stack]
    return max((r for r in runs if isinstance(r, int) and not isinstance(r, bool)), default=0)


def swept_stacks(
    spec: str, stack: Sequence[LayerLike], values: Sequence[float], counter: TokenCounter
) -> list[tuple[str | None, list[list[LayerLike]]]]:
    """The stacks a sweep replays, by series. A guard with a relief run (``default_stack``:
    20) goes deeper than the mark when the conversation grows fast, so above some mark
    every setting keeps the same context: the sweep then replays each mark without the run
    too, and the curve reaches every context the stack can keep.

    Args:
        spec: The stack's name or file (``--stack``).
        stack: That stack, built once (its guard's relief run is read from it).
        values: The low-water marks to sweep.
        counter: The token counter the layers count with.
    """
    run = _relief_run(stack)
    own = [load_stack_at(spec, v, counter=counter) for v in values]
    if not values or not run:
        return [(None, own)]
    off = [load_stack_at(spec, v, counter=counter, relief_run=0) for v in values]
    return [(f"relief_run={run}", own), ("relief_run=0", off)]


def sweep_payload(
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
    terminal a bar counts its replays (one per value and series).

    Args:
        transcript: The conversation to replay.
        swept: The stacks by series (:func:`swept_stacks`).
        values: The low-water marks, one per stack of a series.
        price: The model's price.
        window: The context window, or None for the model's.
        reserve: Tokens kept free for the reply.
        counter: The token counter.
        err: Where the progress bar draws.
    """
    from ..cost import frontier, lost_frontier, sweep

    points: list[SweepPoint] = []
    total = sum(len(stacks) for _, stacks in swept)
    with progress_bar(err, total, "sweeping", "replays") as progress:
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


def sweep_values(text: str) -> tuple[float, ...]:
    if text == "default":
        return DEFAULT_SWEEP
    values: list[float] = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            fail(f"--sweep {text!r}: {item!r} is not a number (e.g. 0.2,0.4,0.6)")
        if not 0 < value <= 1:
            fail(f"--sweep {text!r}: {value} is not a low-water fraction in (0, 1]")
        values.append(value)
    return tuple(values)


def plot_path(spec: str) -> Path:
    """``--plot``'s file, checked before the replay so a long run never ends in an error."""
    path = Path(spec)
    if path.is_dir():
        example = path / "chart.svg"
        fail(f"--plot {spec}: is a directory; give a file name such as {example}", EXIT_OUTPUT)
    if path.suffix.lower() != ".svg":
        fail(
            f"--plot {spec}: the chart is SVG, name the file .svg "
            "(render a PNG with `rsvg-convert chart.svg -o chart.png`)",
            EXIT_OUTPUT,
        )
    parent = path.parent
    if not parent.is_dir():
        fail(f"--plot {spec}: no such directory {str(parent)!r}", EXIT_OUTPUT)
    if not os.access(parent, os.W_OK):
        fail(f"--plot {spec}: directory {str(parent)!r} is not writable", EXIT_OUTPUT)
    return path
