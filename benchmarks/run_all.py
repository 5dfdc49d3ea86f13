"""Run every benchmark of the project and print one table of ratios against baselines.

    python benchmarks/run_all.py [--quick] [--only NAME ...] [--json PATH]

Every ``benchmarks/bench_*.py`` module exposes ``run(quick: bool) -> list[Row]``; each row
carries its own baseline measured in the same run (hand-nested awaits, LangChain's
equivalents when the ``bench`` extra is installed). The run ends with one summary table:
per capability (module and group), tinyctx's time, the best peer's and the floor's
(whichever the rows measured: a peer library, or the bare operation tinyctx wraps, such
as hand-nested awaits, a raw insert+commit or a no-op layer), the ratios and the verdicts.
Results are also written as JSON (default ``benchmarks/results/<commit>.json``) for
comparison across commits.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import structlog

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Row, fmt_seconds, print_table  # noqa: E402


def discover() -> list[str]:
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _row_json(module: str, row: Row) -> dict[str, Any]:
    return {
        "module": module,
        "group": row.group,
        "case": row.case,
        "seconds": row.seconds,
        "baseline": row.baseline,
        "baseline_seconds": row.baseline_seconds,
        "ratio": row.ratio,
        "target": row.target,
        "met": row.met,
        "extra": row.extra,
    }


PEERS = ("LangChain", "LangGraph", "OpenAI", "Agents", "pydantic", "langchain")
"""A baseline naming one of these is a peer library; any other is a floor."""


def _is_peer(baseline: str | None) -> bool:
    return baseline is not None and any(name in baseline for name in PEERS)


def summary_rows(all_rows: list[tuple[str, Row]]) -> list[list[str]]:
    """One line per capability (module / group): its rows with a verdict (else its first
    row), with the best peer and the floor each row was measured against."""
    by_capability: dict[tuple[str, str], list[Row]] = {}
    for module, row in all_rows:
        by_capability.setdefault((module.removeprefix("bench_"), row.group), []).append(row)
    lines: list[list[str]] = []
    for (module, group), rows in by_capability.items():
        judged = [r for r in rows if r.met is not None] or rows[:1]
        for row in judged:
            base = "-" if row.baseline_seconds is None else fmt_seconds(row.baseline_seconds)
            peer = _is_peer(row.baseline) and row.baseline_seconds is not None
            floor = row.baseline is not None and not _is_peer(row.baseline)
            ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
            verdict = "" if row.met is None else ("MET" if row.met else "NOT MET")
            lines.append(
                [
                    f"{module} / {group}",
                    row.case,
                    fmt_seconds(row.seconds),
                    f"{row.baseline} {base}" if peer else "-",
                    ratio if peer else "",
                    f"{row.baseline} {base}" if floor else "-",
                    ratio if floor else "",
                    f"{row.target or ''} {verdict}".strip(),
                ]
            )
    return lines


SUMMARY_HEADER = ["capability", "case", "tinyctx", "best peer", "ratio", "floor", "ratio", "target"]


def summary_markdown(all_rows: list[tuple[str, Row]]) -> str:
    """The summary table as Markdown (what the README's benchmark section shows)."""
    lines = [SUMMARY_HEADER, ["---"] * len(SUMMARY_HEADER), *summary_rows(all_rows)]
    return "\n".join(
        "| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in lines
    )


def print_summary(all_rows: list[tuple[str, Row]]) -> None:
    header = SUMMARY_HEADER
    lines = summary_rows(all_rows)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    print("\nsummary: each capability, tinyctx, the best peer, the floor (ratio = tinyctx / it)")
    for line in [header, *lines]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    bare = [(m, r) for m, r in all_rows if r.baseline is None or r.baseline_seconds is None]
    if bare:  # every row should name a peer or its floor; these are the gaps left
        print(f"\nrows with neither a peer nor a floor measured: {len(bare)}")
        for module, row in bare:
            print(f"  {module} {row.group} / {row.case}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help="module names, e.g. bench_onion")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="also write the summary table as Markdown"
    )
    args = parser.parse_args(argv)

    modules = discover()
    if args.only:
        unknown = sorted(set(args.only) - set(modules))
        if unknown:
            parser.error(
                f"unknown benchmark modules: {', '.join(unknown)} (have: {', '.join(modules)})"
            )
        modules = [m for m in modules if m in args.only]

    all_rows: list[tuple[str, Row]] = []
    crashed: list[str] = []
    for name in modules:
        started = time.perf_counter()
        try:
            module = importlib.import_module(name)
            rows = module.run(quick=args.quick)
        except Exception:  # one broken benchmark must not lose the others' results
            traceback.print_exc()
            crashed.append(name)
            continue
        all_rows.extend((name, row) for row in rows)
        print(
            f"# {name}: {len(rows)} cases in {time.perf_counter() - started:.1f}s", file=sys.stderr
        )

    print_table([row for _, row in all_rows])
    targets = [(m, r) for m, r in all_rows if r.met is not None]
    if targets:
        met = sum(1 for _, r in targets if r.met)
        print(f"\ntargets met: {met}/{len(targets)}")
        for module, row in targets:
            if not row.met:
                print(f"  NOT MET: {module} {row.group} / {row.case} ({row.target})")
    print_summary(all_rows)

    commit = _commit()
    out = args.json or HERE / "results" / f"{commit}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "commit": commit,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "quick": args.quick,
        "rows": [_row_json(m, r) for m, r in all_rows],
    }
    out.write_text(json.dumps(payload, indent=2, default=str))
    if args.markdown is not None:
        args.markdown.write_text(summary_markdown(all_rows) + "\n")
    print(f"\nresults written to {out}", file=sys.stderr)
    if crashed:
        print(f"\nbenchmarks that crashed (no rows): {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # the soaks cancel and kill runs on purpose: their framework warnings (as each bench's
    # own __main__ filters them) would drown the tables
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    raise SystemExit(main())
