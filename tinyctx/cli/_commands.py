"""The commands: ``replay`` and ``stats``."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TinyCtxError
from ..messages import AssistantMessage, ToolResult
from ..tokens import default_counter

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    pass
from ._common import (
    DEFAULT_WINDOW,
    EXIT_EMPTY,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_STOPPED,
    Streams,
    default_reserve,
    fail,
    progress_bar,
)
from ._inputs import (
    bundled_transcript,
    counter_for,
    load_transcript,
    plot_path,
    price_asked,
    sweep_payload,
    sweep_values,
    swept_stacks,
)
from ._stacks import StackError, load_stack


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


def cmd_replay(args: argparse.Namespace, io: Streams) -> int:
    from ..chart import write_chart
    from ..render import console, print_replay, replayed
    from ..replay import replay_sync

    source = args.transcript or str(bundled_transcript())
    if args.window <= 0:
        fail(f"--window {args.window}: must be > 0")
    reserve = default_reserve(args.window) if args.reserve is None else args.reserve
    if reserve < 0 or reserve >= args.window:
        fail(f"--reserve {reserve}: must be >= 0 and below --window ({args.window})")
    plot = plot_path(args.plot) if args.plot else None
    transcript = load_transcript(source, io, args.format, args.record)
    name = "<stdin>" if source == "-" else Path(source).name
    if not transcript:
        fail(f"{source}: the transcript holds no messages; nothing to replay", EXIT_EMPTY)
    if not any(isinstance(m, AssistantMessage) for m in transcript):
        fail(f"{source}: the transcript holds no model answer; nothing to replay", EXIT_EMPTY)
    counter = counter_for(args.tokenizer)
    price = price_asked(args, io)
    values = sweep_values(args.sweep) if args.sweep is not None else ()
    try:
        stack = load_stack(args.stack, counter=counter)
        swept = swept_stacks(args.stack, stack, values, counter)
    except StackError as exc:
        fail(str(exc))
    try:
        with progress_bar(io.err, len(transcript)) as progress:
            report = replay_sync(
                transcript,
                stack,
                window=args.window,
                reserved=reserve,
                counter=counter,
                progress=progress,
            )
    except TinyCtxError as exc:  # a recording the kernel refuses (e.g. an unpaired tool call)
        fail(f"{source}: cannot replay: {exc}", EXIT_INPUT)
    if report.error and not report.rows and not args.json:
        fail(
            f"--window {args.window}: no model call was replayed, the first prompt does not "
            f"fit ({report.error}); choose a larger --window (default: {DEFAULT_WINDOW})",
            EXIT_STOPPED,
        )
    payload = report.to_json()
    payload["transcript"] = "-" if source == "-" else source
    payload["stack"] = args.stack
    # extra per-call data (cost, ...): enrich payload["calls"][i] / payload["summary"] here
    if price is not None:
        from ..cost import add_to_payload

        add_to_payload(payload, report.cost(price))
    if values:
        payload["sweep"] = sweep_payload(
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


def cmd_stats(args: argparse.Namespace, io: Streams) -> int:
    from ..render import console, print_stats

    if args.transcript is None:  # like replay: the bundled session
        args.transcript = str(bundled_transcript())
    transcript = load_transcript(args.transcript, io, args.format, args.record)
    if not transcript:
        fail(f"{args.transcript}: the transcript holds no messages", EXIT_EMPTY)
    heuristic = default_counter()
    real = counter_for(args.tokenizer) if args.tokenizer else None
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
