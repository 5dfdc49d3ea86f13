"""What a context policy costs on real transcripts, next to LangChain's middleware.

    python benchmarks/bench_cost.py [--quick] [--price MODEL]

Replays every transcript of ``../shared/data/transcripts/`` (the ones tinyctx can load) at a
32K and a 128K window through: no management; the named stacks (``default_stack``,
``seed_order_stack``), and ``default_stack`` with folded instead of stacked summaries
(``keep_summaries=0``), to show what stacking them saves; each context layer alone at its
defaults; and LangChain's
``SummarizationMiddleware`` and ``ContextEditingMiddleware`` (``bench`` extra) at matched
settings — the same trigger (90% of the usable window in the policy table), the same tail
kept (the low-water mark, as tokens) and the same offline summary text (tinyctx's
ExtractiveSummarizer), so only the policies differ. Everyone is counted by one token counter
(tinyctx's heuristic) and priced by :mod:`tinyctx.cost` (Claude Sonnet 4.5 prices by default).

Printed: cost, prefix breaks and average prompt tokens per transcript and policy; then the
three checks of issue #20, each MET or NOT MET per transcript:

- never worse than doing nothing: where no management overflows the window, no named stack
  and no single layer at its defaults costs more than none or sends more calls over the
  window (where everything fits it holds by construction: shown, not judged);
- few prefix breaks: ``default_stack`` breaks the cached prefix at most once per 20 calls
  at 32K;
- the sweep: ``default_stack`` swept over its low-water mark (its main knob; printed beside
  it, the curve with ``relief_run=0`` added, which reaches the most context the stack can
  keep) against LangChain's pair swept over the same knob (the tokens kept after a summary),
  LangChain triggered at 90% of the usable window and at tinyctx's default (only a request
  that would not fit). Each curve is
  its frontier (settings no other setting beats on both cost and context), interpolated
  linearly; they are compared at equal average prompt tokens over the range both cover
  (:func:`tinyctx.cost.compare_curves`), and the table shows where ours compares worst.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import attrs  # noqa: E402
from _cost_langchain import RESERVE, TRIGGER, langchain_available, langchain_stack  # noqa: E402
from _harness import Row, shared_data  # noqa: E402

from tinyctx import Message  # noqa: E402
from tinyctx.chain import LayerLike  # noqa: E402
from tinyctx.cost import (  # noqa: E402
    DEFAULT_PRICE,
    ModelPrice,
    SweepPoint,
    compare_curves,
    frontier,
    price_for,
    price_replay,
)
from tinyctx.formats import load_transcript  # noqa: E402
from tinyctx.middleware import (  # noqa: E402
    BudgetGuard,
    ClearOldImages,
    ExtractiveSummarizer,
    Microcompact,
    Summarize,
    ToolResultBudget,
)
from tinyctx.middleware.stacks import default_stack, seed_order_stack  # noqa: E402
from tinyctx.replay import ReplayReport, replay_sync  # noqa: E402
from tinyctx.tokens import TokenCounter, default_counter  # noqa: E402

WINDOWS = (32_000, 128_000)
SWEEP = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def transcript_files(data: Path) -> list[Path]:
    """Every transcript: the normalized ones, and raw files that have no normalized copy."""
    root = data / "transcripts"
    files = sorted(root.glob("**/openai/*.jsonl"))
    normalized = {p.name.split(".")[0] for p in files}
    for raw in sorted(root.glob("**/raw/*")):
        if raw.name.split(".")[0] not in normalized:
            files.append(raw)
    return files


def load_all(data: Path) -> tuple[list[tuple[str, tuple[Message, ...]]], list[str]]:
    """The transcripts tinyctx loads, and a note for each it cannot (yet)."""
    loaded: list[tuple[str, tuple[Message, ...]]] = []
    skipped: list[str] = []
    for path in transcript_files(data):
        try:
            messages = tuple(load_transcript(path))
        except Exception as exc:  # a format or content part tinyctx does not read yet
            skipped.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if messages:
            loaded.append((path.name.split(".")[0], messages))
    return loaded, skipped


# ---------------------------------------------------------------------------------------
# policies


Factory = Callable[[TokenCounter, int, float], list[LayerLike]]


def policies(with_langchain: bool) -> dict[str, Factory]:
    named: dict[str, Factory] = {
        "none": lambda c, w, lw: [],
        "default_stack": lambda c, w, lw: default_stack(counter=c, low_water=lw),
        # the same with every summary folding the previous one (no stacked summaries)
        "default_stack(keep_summaries=0)": lambda c, w, lw: default_stack(
            counter=c, low_water=lw, keep_summaries=0
        ),
        "seed_order_stack": lambda c, w, lw: seed_order_stack(counter=c, low_water=lw),
        "BudgetGuard()": lambda c, w, lw: [BudgetGuard(counter=c)],
        "Microcompact()": lambda c, w, lw: [Microcompact(counter=c)],
        "Summarize()": lambda c, w, lw: [Summarize(ExtractiveSummarizer(), counter=c)],
        "ToolResultBudget()": lambda c, w, lw: [ToolResultBudget()],
        "ClearOldImages()": lambda c, w, lw: [ClearOldImages(counter=c)],
    }
    if with_langchain:
        named["langchain summarization+editing"] = lambda c, w, lw: langchain_stack(
            c, w, lw, editing=True, summary=True
        )
        named["langchain summarization"] = lambda c, w, lw: langchain_stack(
            c, w, lw, editing=False, summary=True
        )
        named["langchain context editing"] = lambda c, w, lw: langchain_stack(
            c, w, lw, editing=True, summary=False
        )
    return named


def replay_one(
    messages: tuple[Message, ...], layers: list[LayerLike], window: int, counter: TokenCounter
) -> ReplayReport:
    return replay_sync(messages, layers, window=window, reserved=RESERVE, counter=counter)


def over_window(report: ReplayReport) -> int:
    return report.overflows_remaining


def sweep_points(
    messages: tuple[Message, ...],
    factory: Factory,
    window: int,
    counter: TokenCounter,
    price: ModelPrice,
    values: Sequence[float] = SWEEP,
) -> list[SweepPoint]:
    points: list[SweepPoint] = []
    for value in values:
        report = replay_one(messages, factory(counter, window, value), window, counter)
        cost = price_replay(report, price)
        error = report.error or (
            f"{over_window(report)} calls over" if over_window(report) else None
        )
        points.append(
            SweepPoint(
                value, cost.average_prompt_tokens, cost.total, cost.breaks, len(cost.calls), error
            )
        )
    return points


def curve_verdict(ours: Sequence[SweepPoint], theirs: Sequence[SweepPoint]) -> tuple[bool, str]:
    """Whether tinyctx's curve lies below LangChain's, and the table cells saying so.

    Both curves are compared at equal average prompt tokens over the range both cover
    (:func:`tinyctx.cost.compare_curves`: the frontier of each sweep, interpolated linearly).
    Where LangChain keeps the window at no setting there is no curve of theirs: that counts
    as below only when ours keeps it."""
    mine = frontier(ours)
    if not mine:
        return (
            False,
            f"{'-':>9} {'-':>9} {'-':>9} {'-':>7}  NOT MET: tinyctx never keeps the window",
        )
    if not frontier(theirs):
        least = mine[0]
        return True, (
            f"{least.average_prompt_tokens / 1000:>8.1f}k ${least.cost:>8.3f} {'over':>9} "
            f"{'-':>7}  MET: LangChain overflows the window at every setting"
        )
    comparison = compare_curves(ours, theirs)
    worst = comparison.worst
    if worst is None:
        return False, (
            f"{'-':>9} {'-':>9} {'-':>9} {'-':>7}  NOT MET: the curves share no range "
            f"(ours {mine[0].average_prompt_tokens:.0f}-{mine[-1].average_prompt_tokens:.0f}, "
            f"theirs {frontier(theirs)[0].average_prompt_tokens:.0f}-"
            f"{frontier(theirs)[-1].average_prompt_tokens:.0f})"
        )
    x, mine_cost, their_cost = worst
    mean = comparison.mean_ratio or 0.0
    verdict = "MET" if comparison.below else "NOT MET"
    return comparison.below, (
        f"{x / 1000:>8.1f}k ${mine_cost:>8.3f} ${their_cost:>8.3f} "
        f"{mine_cost / their_cost - 1:>+7.1%}"
        f"  {verdict}: {len(comparison.samples)} points "
        f"{comparison.low / 1000:.1f}k-{comparison.high / 1000:.1f}k, mean {mean - 1:+.1%}"
    )


# ---------------------------------------------------------------------------------------


Results = dict[str, tuple[float, int, int, float, int, float]]
"""Per policy: cost, prefix breaks, calls, average prompt tokens, calls over the window (or
an error) and replay seconds."""


LANGCHAIN_TRIGGERS: tuple[float, ...] = (TRIGGER, 1.0)
"""LangChain's pair is swept at 90% of the usable window and at tinyctx's own default (only a
request that would not fit): the curve must lie below both."""


@attrs.define
class _Report:
    """The checks' tables and verdicts, gathered over every transcript and window."""

    fits: list[str] = attrs.field(factory=list)
    worse: list[str] = attrs.field(factory=list)
    breaks: list[str] = attrs.field(factory=list)
    curves: list[str] = attrs.field(factory=list)
    worse_ok: bool = True
    breaks_ok: bool = True
    curve_ok: bool = True
    curve_counts: dict[float, list[int]] = attrs.field(
        factory=lambda: {at: [0, 0] for at in LANGCHAIN_TRIGGERS}
    )
    extended_counts: dict[float, int] = attrs.field(
        factory=lambda: dict.fromkeys(LANGCHAIN_TRIGGERS, 0)
    )


def _replay_policies(
    messages: tuple[Message, ...],
    named: dict[str, Factory],
    counter: TokenCounter,
    window: int,
    price: ModelPrice,
) -> Results:
    results: Results = {}
    for policy, factory in named.items():
        started = time.perf_counter()
        report = replay_one(messages, factory(counter, window, _low_water()), window, counter)
        seconds = time.perf_counter() - started
        cost = price_replay(report, price)
        over = over_window(report) + (1 if report.error else 0)
        calls = len(cost.calls)
        results[policy] = (
            cost.total,
            cost.breaks,
            calls,
            cost.average_prompt_tokens,
            over,
            seconds,
        )
    return results


def _print_results(name: str, results: Results) -> None:
    for policy, (cost, breaks, calls, average, over, _) in results.items():
        print(
            f"{name[:34]:<34} {policy:<32} ${cost:>8.3f} {breaks:>6} "
            f"{calls:>5} {average:>10.0f} {over:>5}"
        )


REPLAY_BASELINE = "replay time, no management"
"""The cost rows' time is the replay of ``default_stack``; the ratio is its replay time over
no management's (the costs are in the target text and ``extra``)."""


def _management_rows(label: str, results: Results, report: _Report) -> list[Row]:
    """Never worse than no management, judged where no management overflows the window (a
    stack or layer that costs more or sends more calls over the window than none is a
    regression); where everything fits it holds by construction, so it is shown unjudged."""
    none_cost, _, _, _, none_over, none_seconds = results["none"]
    ours = [p for p in results if p != "none" and not p.startswith("langchain")]
    priciest = max(ours, key=lambda p: results[p][0])
    extra: dict[str, Any] = {
        "none_cost": none_cost,
        "default_stack_cost": results["default_stack"][0],
    }
    ratio = results[priciest][0] / none_cost if none_cost else 0.0
    line = f"{label} ${none_cost:>8.4f} ${results[priciest][0]:>8.4f} {priciest:<20}"
    seconds = results["default_stack"][5]
    if none_over == 0:
        report.fits.append(f"{line} (fits: not judged)")
        return [
            Row("cost: fits unmanaged", label, seconds, REPLAY_BASELINE, none_seconds, extra=extra)
        ]
    worse = [p for p in ours if results[p][0] > none_cost * (1 + 1e-9) or results[p][4] > none_over]
    report.worse_ok = report.worse_ok and not worse
    report.worse.append(f"{line} {'NOT MET: ' + ', '.join(worse) if worse else 'MET'}")
    target = f"priciest stack/layer {ratio:.2f}x none's cost, none over more: <= 1x"
    extra["more_expensive"] = worse
    return [
        Row(
            "cost: never worse (overflows)",
            label,
            seconds,
            REPLAY_BASELINE,
            none_seconds,
            target=target,
            met=not worse,
            extra=extra,
        )
    ]


def _breaks_row(label: str, results: Results, report: _Report) -> Row:
    total, breaks, calls, average, _, seconds = results["default_stack"]
    ok = breaks * 20 <= max(calls, 20)
    report.breaks_ok = report.breaks_ok and ok
    report.breaks.append(f"{label} {breaks:>6} {calls:>6} {'MET' if ok else 'NOT MET'}")
    return Row(
        "cost: breaks @32K",
        label,
        seconds,
        REPLAY_BASELINE,
        results["none"][5],
        target=f"{breaks} breaks/{calls} calls <= 1/20",
        met=ok,
        extra={"cost": total, "none_cost": results["none"][0], "average": average},
    )


def _sweep_rows(
    label: str,
    messages: tuple[Message, ...],
    named: dict[str, Factory],
    sweep: tuple[int, TokenCounter, ModelPrice, bool],
    report: _Report,
) -> list[Row]:
    """default_stack() swept over its main knob, the low-water mark (its relief run stays at
    20: a relief never leaves room for fewer than 20 calls), against LangChain's pair.
    Printed beside it: the curve with relief_run=0 added, which reaches the most context the
    stack can keep (what `tinyctx replay --sweep` shows)."""
    window, counter, price, verbose = sweep
    started = time.perf_counter()
    ours_curve = sweep_points(messages, named["default_stack"], window, counter, price)
    sweep_seconds = time.perf_counter() - started
    extended = ours_curve + sweep_points(messages, _default_stack_run_off, window, counter, price)
    rows: list[Row] = []
    for at in LANGCHAIN_TRIGGERS:
        theirs_curve = sweep_points(messages, _langchain_at(at), window, counter, price)
        below, cells = curve_verdict(ours_curve, theirs_curve)
        below_extended, extended_cells = curve_verdict(extended, theirs_curve)
        report.curve_ok = report.curve_ok and below
        report.curve_counts[at][0] += below
        report.curve_counts[at][1] += 1
        report.extended_counts[at] += below_extended
        report.curves.append(f"{label} {_trigger_label(at):>5} {cells}")
        report.curves.append(f"{'':<40} {'':>5} {'':>5} {extended_cells}  (with relief_run=0 too)")
        if verbose:
            report.curves.append(_curve_points(extended, theirs_curve))
        rows.append(
            Row(
                "cost: sweep vs LangChain",
                f"{label} LangChain trigger {_trigger_label(at)}",
                sweep_seconds,
                None,
                None,
                target="default_stack curve below",
                met=below,
                extra={
                    "ours": [p.to_json() for p in ours_curve],
                    "langchain": [p.to_json() for p in theirs_curve],
                    "comparison": compare_curves(ours_curve, theirs_curve).to_json(),
                    "ours_with_relief_run_0": [p.to_json() for p in extended],
                    "comparison_with_relief_run_0": compare_curves(
                        extended, theirs_curve
                    ).to_json(),
                },
            )
        )
    return rows


def _print_totals(window: int, count: int, totals: dict[str, list[float]]) -> None:
    print(
        f"\n-- totals at {window // 1000}K over the transcripts no management does "
        f"not fit (of {count}):"
    )
    for policy, (c, b, n, over) in totals.items():
        print(
            f"   {policy:<32} ${c:>8.2f}  {int(b):>4} breaks  {int(n):>5} calls  "
            f"{int(over):>4} calls over the window"
        )


def _add_totals(totals: dict[str, list[float]], results: Results) -> None:
    for policy, (c, b, n, _, over, _) in results.items():
        entry = totals.setdefault(policy, [0.0, 0, 0, 0])
        for i, value in enumerate((c, b, n, over)):
            entry[i] += value


def run(
    quick: bool = False,
    price_name: str = DEFAULT_PRICE,
    verbose: bool = False,
    sweeps: bool = True,
) -> list[Row]:
    data = shared_data()
    if data is None:
        print("shared data not found (set TINYCTX_SHARED_DATA): bench_cost skipped")
        return []
    price = price_for(price_name)
    counter = default_counter()
    transcripts, skipped = load_all(data)
    for note in skipped:
        print(f"# bench_cost: skipped {note}", file=sys.stderr)
    with_langchain = langchain_available()
    named = policies(with_langchain)
    if quick:
        named = {k: v for k, v in named.items() if k in ("none", "default_stack")}
    rows: list[Row] = []
    report = _Report()
    for window in WINDOWS:
        totals: dict[str, list[float]] = {}
        if verbose:
            print(f"\n== window {window} (usable {window - RESERVE}), {price.name} prices")
            print(
                f"{'transcript':<34} {'policy':<32} {'cost':>9} {'breaks':>6} "
                f"{'calls':>5} {'avg prompt':>10} {'over':>5}"
            )
        for name, messages in transcripts:
            results = _replay_policies(messages, named, counter, window, price)
            if verbose:
                _print_results(name, results)
            none_over = results["none"][4]
            if none_over:  # the transcripts where management is needed
                _add_totals(totals, results)
            label = f"{name[:40]:<40} {window // 1000:>4}K"
            rows += _management_rows(label, results, report)
            if window == 32_000:
                rows.append(_breaks_row(label, results, report))
            if with_langchain and not quick and none_over > 0 and sweeps:
                sweep = (window, counter, price, verbose)
                rows += _sweep_rows(label, messages, named, sweep, report)
        if verbose and totals:
            _print_totals(window, sum(1 for _, m in transcripts if m), totals)
    if verbose:
        _print_report(report)
    return rows


def _print_report(report: _Report) -> None:
    head = f"{'transcript':<40} {'window':>5}"
    print("\n== never worse than doing nothing, where no management overflows the window")
    print(f"{head} {'none':>9} {'priciest':>9} {'(stack/layer)':<20} verdict")
    print("\n".join(report.worse + report.fits))
    print("\n== default_stack prefix breaks at 32K (at most 1 per 20 calls)")
    print(f"{head} {'breaks':>6} {'calls':>6} verdict")
    print("\n".join(report.breaks))
    if report.curves:
        print(
            "\n== sweep of the low-water mark: default_stack vs LangChain "
            "summarization+editing at equal average prompt tokens\n"
            "   (each curve's frontier, interpolated linearly, over the range both cover; "
            "the point where ours compares worst)\n"
            "   LangChain's trigger: 90% of the usable window, or 'over' (only a request that "
            "would not fit, tinyctx's default)"
        )
        print(
            f"{head} {'LC at':>5} {'avg tok':>9} {'tinyctx':>9} {'langchain':>9} {'diff':>7}"
            "  verdict"
        )
        print("\n".join(report.curves))
    print(
        f"\nnever worse than no management (where it overflows): "
        f"{'MET' if report.worse_ok else 'NOT MET'}; "
        "default_stack <= 1 break per 20 calls at 32K: "
        f"{'MET' if report.breaks_ok else 'NOT MET'}; "
        "sweep below LangChain's: "
        + (("MET" if report.curve_ok else "NOT MET") if report.curves else "not run")
    )
    for at, (met, runs) in report.curve_counts.items():
        if runs:
            print(
                f"   below LangChain triggered at {_trigger_label(at)}: "
                f"{met} of {runs} transcript windows (with relief_run=0 too: "
                f"{report.extended_counts[at]} of {runs})"
            )


def _default_stack_run_off(counter: TokenCounter, window: int, low_water: float) -> list[LayerLike]:
    """``default_stack`` with ``relief_run=0``: relieved to the low-water mark, whatever the
    conversation's growth."""
    return default_stack(counter=counter, low_water=low_water, relief_run=0)


def _langchain_at(trigger: float) -> Factory:
    return lambda c, w, lw: langchain_stack(c, w, lw, editing=True, summary=True, trigger=trigger)


def _trigger_label(trigger: float) -> str:
    return "over" if trigger >= 1 else f"{trigger:.0%}"


def _low_water() -> float:
    from tinyctx.middleware.stacks import DEFAULT_LOW_WATER

    return DEFAULT_LOW_WATER


def _curve_points(ours: Sequence[SweepPoint], theirs: Sequence[SweepPoint]) -> str:
    def fmt(points: Sequence[SweepPoint]) -> str:
        return " ".join(
            f"({p.average_prompt_tokens / 1000:.1f}k ${p.cost:.3f}{'*' if p.error else ''})"
            for p in points
        )

    return f"     tinyctx   {fmt(ours)}\n     langchain {fmt(theirs)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="none and default_stack only")
    parser.add_argument("--price", default=DEFAULT_PRICE, help="model whose prices to use")
    args = parser.parse_args(argv)
    run(quick=args.quick, price_name=args.price, verbose=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
