"""The ``tinyctx replay --plot`` chart: a dependency-free SVG you can read numbers off.

Tokens per model call on labelled axes with ticks: what the stack sent, what the recording
would have cost without it, the window and the usable window as lines, a marker for each
layer action (one shape per layer or policy, in the legend), and a stop marker when the
stack could not keep the transcript inside the window. It renders from the command's JSON
payload; :data:`CHART_SERIES` lists the per-call keys drawn as lines (append to add one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from attrs import frozen

__all__ = [
    "Series",
    "CHART_SERIES",
    "svg_chart",
    "write_chart",
    "nice_ticks",
    "lost_frontier_svg",
]


@frozen
class Series:
    """A line of the chart: the call dict's ``key`` (tokens), its legend label and look.

    Args:
        key: The key of each call's dict the line draws (a token count).
        label: The line's legend label.
        color: Its SVG colour.
        dash: Its SVG dash array ("" for a solid line).
        width: Its stroke width.
    """

    key: str
    label: str
    color: str
    dash: str = ""
    width: float = 2.0


CHART_SERIES: list[Series] = [
    Series("raw_tokens", "without the stack", "#8a8a8a", dash="5 4", width=1.5),
    Series("tokens", "sent (with the stack)", "#1f6fb2"),
    Series("cache_read_tokens", "read from the prompt cache (--price)", "#2a9d8f", width=1.5),
]
"""Lines drawn per call, in order; a series is drawn when the calls have its key."""

# one marker per layer or policy name, in order of first appearance
_MARKERS = ("circle", "square", "triangle", "diamond", "star")  # the cross marks the stop
_COLORS = ("#e08a00", "#2a9d3a", "#9b4dca", "#d6336c", "#0b7285", "#6b4f1d", "#495057")
_STEP = 12  # px between the markers of two layers that acted on the same call
_W, _H = 1080, 520
_LEFT, _RIGHT, _TOP, _BOTTOM = 82, 720, 70, 440


def nice_ticks(high: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to at least ``high`` (steps of 1, 2 or 5 times 10^k)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    top = math.ceil(high / step - 1e-9) * step
    return [i * step for i in range(round(top / step) + 1)]


def _label(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _marker(
    shape: str, x: float, y: float, color: str, title: str = "", *, hollow: bool = False
) -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    fill, stroke = ("white", color) if hollow else (color, "white")
    attrs = f'fill="{fill}" stroke="{stroke}" stroke-width="0.8"'
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" {attrs}>{tip}</circle>'
    if shape == "square":
        return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" {attrs}>{tip}</rect>'
    if shape == "cross":
        return (
            f'<path d="M{x - 4:.1f},{y - 4:.1f} L{x + 4:.1f},{y + 4:.1f} M{x - 4:.1f},'
            f'{y + 4:.1f} L{x + 4:.1f},{y - 4:.1f}" stroke="{color}" stroke-width="2.2">'
            f"{tip}</path>"
        )
    if shape == "star":
        star = []
        for i in range(10):
            radius = 6.0 if i % 2 == 0 else 2.6
            angle = math.pi / 2 + i * math.pi / 5
            star.append(f"{x + radius * math.cos(angle):.1f},{y - radius * math.sin(angle):.1f}")
        return f'<polygon points="{" ".join(star)}" {attrs}>{tip}</polygon>'
    if shape == "triangle":
        corners = [(0.0, -5.5), (5.0, 4.0), (-5.0, 4.0)]
    else:  # diamond
        corners = [(0.0, -5.5), (5.0, 0.0), (0.0, 5.5), (-5.0, 0.0)]
    points = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in corners)
    return f'<polygon points="{points}" {attrs}>{tip}</polygon>'


def svg_chart(payload: Mapping[str, Any], name: str, *, stack: str | None = None) -> str:
    """The chart of a replay's JSON payload as SVG text."""
    calls: Sequence[Mapping[str, Any]] = payload["calls"]
    summary: Mapping[str, Any] = payload["summary"]
    window, usable = payload.get("window"), payload.get("usable")
    series = [s for s in CHART_SERIES if any(c.get(s.key) is not None for c in calls)]
    values = [float(c[s.key]) for c in calls for s in series if c.get(s.key) is not None]
    y_ticks = nice_ticks(max([*values, float(window or 0), 1.0]) * 1.04)
    stopped_at = len(calls) + 1 if summary.get("error") else None
    x_ticks = [t for t in nice_ticks(max(len(calls), stopped_at or 1, 2), 8) if t >= 1]
    if x_ticks[0] != 1:
        x_ticks.insert(0, 1.0)
    plot = _Plot(max(x_ticks[-1], 2.0), y_ticks[-1])
    sweep = payload.get("sweep")
    lost_panel = bool(sweep) and any(
        p.get("lost_rate") is not None for p in (sweep or {}).get("points", ())
    )
    height = _H + (_SWEEP_H if sweep else 0) + (_SWEEP_H if lost_panel else 0)
    out = _heading(payload, name, stack, height)
    out += _grid(plot, x_ticks, y_ticks)
    legend: list[tuple[str, str]] = []  # (swatch svg at 0,0, label)
    out += _limit_lines(plot, window, usable, legend)
    out += _series_lines(plot, calls, series, legend)
    out += _action_marks(plot, calls, legend)
    losses = _loss_marks(calls, plot.x)
    out += losses
    if losses:
        lost = sum(1 for c in calls if c.get("lost_uses"))
        legend.append(
            (
                _loss_mark(11, 0),
                f"lost references ({lost} call{'' if lost == 1 else 's'}, "
                f"{percent_text(summary.get('lost_rate'))} of uses)",
            )
        )
    error = summary.get("error")
    if error and stopped_at is not None:
        out += _stop_mark(plot, stopped_at, error, legend)
    out += _legend(legend)
    if sweep:
        out += _sweep_panel(sweep["points"], sweep.get("knob", "low_water"), _H)
    if sweep and lost_panel:
        out += _lost_panel(sweep["points"], sweep.get("knob", "low_water"), _H + _SWEEP_H)
    out.append("</svg>")
    return "\n".join(out) + "\n"


class _Plot:
    """The main plot's scales: a model call's number to x, a token count to y."""

    def __init__(self, x_top: float, y_top: float) -> None:
        self.x_top, self.y_top = x_top, y_top

    def x(self, index: float) -> float:
        return _LEFT + (_RIGHT - _LEFT) * (index - 1) / (self.x_top - 1)

    def y(self, tokens: float) -> float:
        return _BOTTOM - (_BOTTOM - _TOP) * tokens / self.y_top


def _heading(payload: Mapping[str, Any], name: str, stack: str | None, height: int) -> list[str]:
    """The SVG's opening, its background, the title and the line of facts under it."""
    summary: Mapping[str, Any] = payload["summary"]
    window = payload.get("window")
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" '
        'font-size="12">',
        f'<rect width="{_W}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="28" font-size="16" font-weight="bold">'
        f"tinyctx replay: {escape(name)}</text>",
    ]
    facts = [f"{summary['model_calls']} of {summary.get('recorded_model_calls', '?')} model calls"]
    if stack:
        facts.insert(0, f"stack {stack}")
    if window is not None:
        facts.append(f"window {window:,} tokens, {payload['reserved']:,} reserved")
    out.append(f'<text x="{_LEFT}" y="48" fill="#444">{escape(" · ".join(facts))}</text>')
    return out


def _grid(plot: _Plot, x_ticks: Sequence[float], y_ticks: Sequence[float]) -> list[str]:
    """Grid, ticks and tick labels, the axes and their titles."""
    x, y = plot.x, plot.y
    out: list[str] = []
    for tick in y_ticks:
        out.append(
            f'<line x1="{_LEFT}" y1="{y(tick):.1f}" x2="{_RIGHT}" y2="{y(tick):.1f}" '
            'stroke="#e6e6e6"/>'
        )
        out.append(
            f'<line x1="{_LEFT - 5}" y1="{y(tick):.1f}" x2="{_LEFT}" y2="{y(tick):.1f}" '
            'stroke="#333"/>'
        )
        out.append(
            f'<text x="{_LEFT - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    for tick in x_ticks:
        out.append(
            f'<line x1="{x(tick):.1f}" y1="{_BOTTOM}" x2="{x(tick):.1f}" y2="{_BOTTOM + 5}" '
            'stroke="#333"/>'
        )
        out.append(
            f'<text x="{x(tick):.1f}" y="{_BOTTOM + 19}" text-anchor="middle">{_label(tick)}</text>'
        )
    out += [
        f'<line x1="{_LEFT}" y1="{_BOTTOM}" x2="{_RIGHT}" y2="{_BOTTOM}" stroke="#333"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_BOTTOM}" stroke="#333"/>',
        f'<text x="{(_LEFT + _RIGHT) / 2}" y="{_BOTTOM + 42}" text-anchor="middle">'
        "model call (number)</text>",
        f'<text x="22" y="{(_TOP + _BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 22 {(_TOP + _BOTTOM) / 2})">prompt size (tokens)</text>',
    ]
    return out


def _limit_lines(
    plot: _Plot, window: int | None, usable: int | None, legend: list[tuple[str, str]]
) -> list[str]:
    """The window's line and, when a reserve makes it lower, the usable budget's."""
    y = plot.y
    out: list[str] = []
    if window is not None:
        out.append(
            f'<line x1="{_LEFT}" y1="{y(window):.1f}" x2="{_RIGHT}" y2="{y(window):.1f}" '
            'stroke="#c92a2a" stroke-width="1.5"/>'
        )
        legend.append(
            (
                '<line x1="0" y1="0" x2="22" y2="0" stroke="#c92a2a" stroke-width="1.5"/>',
                f"window ({window:,})",
            )
        )
    if usable is not None and usable != window:
        out.append(
            f'<line x1="{_LEFT}" y1="{y(usable):.1f}" x2="{_RIGHT}" y2="{y(usable):.1f}" '
            'stroke="#e8590c" stroke-width="1.5" stroke-dasharray="8 3 2 3"/>'
        )
        legend.append(
            (
                '<line x1="0" y1="0" x2="22" y2="0" stroke="#e8590c" stroke-width="1.5" '
                'stroke-dasharray="8 3 2 3"/>',
                f"usable ({usable:,} = window - reserve)",
            )
        )
    return out


def _series_lines(
    plot: _Plot,
    calls: Sequence[Mapping[str, Any]],
    series: Sequence[Series],
    legend: list[tuple[str, str]],
) -> list[str]:
    """One polyline per series the calls carry (prompt tokens and the like)."""
    x, y = plot.x, plot.y
    out: list[str] = []
    for s in series:
        points = " ".join(
            f"{x(i + 1):.1f},{y(float(c[s.key])):.1f}"
            for i, c in enumerate(calls)
            if c.get(s.key) is not None
        )
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<polyline fill="none" stroke="{s.color}" stroke-width="{s.width}"{dash} '
            f'points="{points}"><title>{escape(s.label)}</title></polyline>'
        )
        legend.append(
            (
                f'<line x1="0" y1="0" x2="22" y2="0" stroke="{s.color}" stroke-width="{s.width}"'
                f"{dash}/>",
                s.label,
            )
        )
    return out


def _action_marks(
    plot: _Plot, calls: Sequence[Mapping[str, Any]], legend: list[tuple[str, str]]
) -> list[str]:
    """A marker per layer action, one shape and colour per layer or policy name."""
    x, y = plot.x, plot.y
    out: list[str] = []
    kinds: dict[str, tuple[str, str]] = {}
    counts: dict[str, int] = {}
    for i, call in enumerate(calls):
        stacked: list[str] = []  # the names marked on this call: each a step above the last
        for event in call.get("events") or ():
            if event["kind"] == "context.pressure":
                continue  # a measurement, not an action: the line shows it
            key = event["name"]
            if key not in kinds:
                n = len(kinds)
                kinds[key] = (_MARKERS[n % len(_MARKERS)], _COLORS[n % len(_COLORS)])
            counts[key] = counts.get(key, 0) + 1
            if key not in stacked:
                stacked.append(key)
            shape, color = kinds[key]
            out.append(
                _marker(
                    shape,
                    x(i + 1),
                    y(float(call.get("tokens") or 0)) - _STEP * stacked.index(key),
                    color,
                    f"call {call['index']}: {event['label']}",
                )
            )
    for key, (shape, color) in kinds.items():
        times = f"{counts[key]} call{'' if counts[key] == 1 else 's'}"
        legend.append((_marker(shape, 11, 0, color), f"{key} ({times})"))
    return out


def _stop_mark(
    plot: _Plot, stopped_at: int, error: str, legend: list[tuple[str, str]]
) -> list[str]:
    """Where the replay stopped: the call that did not fit, marked and labelled."""
    sx = plot.x(stopped_at)
    left = sx < (_LEFT + _RIGHT) / 2
    legend.append((_marker("cross", 11, 0, "#c92a2a"), "stopped: did not fit"))
    return [
        f'<line x1="{sx:.1f}" y1="{_TOP}" x2="{sx:.1f}" y2="{_BOTTOM}" stroke="#c92a2a" '
        'stroke-width="2" stroke-dasharray="3 3"/>',
        _marker("cross", sx, _TOP + 8, "#c92a2a", f"stopped: {error}"),
        f'<text x="{sx + (8 if left else -8):.1f}" y="{_TOP + 12}" '
        f'text-anchor="{"start" if left else "end"}" fill="#c92a2a" font-weight="bold">'
        f"stopped: call {stopped_at} did not fit</text>",
    ]


def _legend(legend: Sequence[tuple[str, str]]) -> list[str]:
    """The legend at the right of the plot: a swatch and a label per row."""
    lx, ly = _RIGHT + 24, _TOP + 6
    out = [f'<text x="{lx}" y="{ly}" font-weight="bold">legend</text>']
    for n, (swatch, label) in enumerate(legend):
        row = ly + 22 + n * 20
        out.append(f'<g transform="translate({lx},{row - 4})">{swatch}</g>')
        out.append(f'<text x="{lx + 30}" y="{row}">{escape(label)}</text>')
    return out


_SWEEP_H = 340
_SWEEP_COLORS = ("#2a9d8f", "#e08a00", "#9b4dca", "#1f6fb2")


def _sweep_panel(points: Sequence[Mapping[str, Any]], knob: str, top: float) -> list[str]:
    """Under the main chart: cost against average prompt tokens, one point per value of the
    swept knob (``tinyctx replay --sweep``): the curve a user picks a setting from."""
    good = [p for p in points if p.get("error") is None] or list(points)
    left, right, upper, lower = _LEFT, _RIGHT, top + 50, top + _SWEEP_H - 50
    x_ticks = nice_ticks(max(p["average_prompt_tokens"] for p in good) * 1.04)
    y_ticks = nice_ticks(max(max(p["cost"] for p in good), 1e-9) * 1.08)

    def x(tokens: float) -> float:
        return left + (right - left) * tokens / x_ticks[-1]

    def y(cost: float) -> float:
        return lower - (lower - upper) * cost / y_ticks[-1]

    out = [
        f'<text x="{left}" y="{top + 24}" font-size="14" font-weight="bold">sweep of {knob}: '
        "cost against average prompt tokens</text>",
        f'<line x1="{left}" y1="{lower}" x2="{right}" y2="{lower}" stroke="#333"/>',
        f'<line x1="{left}" y1="{upper}" x2="{left}" y2="{lower}" stroke="#333"/>',
    ]
    for tick in x_ticks:
        out.append(
            f'<text x="{x(tick):.1f}" y="{lower + 16}" text-anchor="middle" fill="#444">'
            f"{_label(tick)}</text>"
        )
    for tick in y_ticks:
        out.append(
            f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end" fill="#444">'
            f"${tick:.2f}</text>"
        )
    # one line per series (a stack with a relief run is swept with it and without it); the
    # points on the frontier, the settings worth picking, are filled, the others hollow
    series: dict[str | None, list[Mapping[str, Any]]] = {}
    for p in good:
        series.setdefault(p.get("series"), []).append(p)
    for n, (label, members) in enumerate(series.items()):
        color = _SWEEP_COLORS[n % len(_SWEEP_COLORS)]
        ordered = sorted(members, key=lambda p: p["average_prompt_tokens"])
        line = " ".join(f"{x(p['average_prompt_tokens']):.1f},{y(p['cost']):.1f}" for p in ordered)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        if label is not None:  # in the legend column, at the right of the panel
            row = upper + 20 * n
            out.append(
                f'<line x1="{right + 24}" y1="{row - 4}" x2="{right + 46}" y2="{row - 4}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
            out.append(f'<text x="{right + 54}" y="{row}">{escape(label)}</text>')
        for p in ordered:
            px, py = x(p["average_prompt_tokens"]), y(p["cost"])
            title = (
                f"{knob} {p['value']:g}{'' if label is None else ', ' + label}: "
                f"${p['cost']:.4f}, {p['average_prompt_tokens']:,.0f} tokens per call, "
                f"{p['prefix_breaks']} prefix breaks"
            )
            hollow = p.get("frontier") is False
            out.append(_marker("circle", px, py, color, title, hollow=hollow))
            out.append(
                f'<text x="{px:.1f}" y="{py - 10:.1f}" text-anchor="middle">{p["value"]:g}</text>'
            )
    if any(p.get("frontier") is False for p in good):
        out.append(
            f'<text x="{right}" y="{lower - 8}" text-anchor="end" fill="#444">filled: on the '
            "curve (no other setting keeps as much context for less)</text>"
        )
    out.append(
        f'<text x="{(left + right) / 2}" y="{lower + 36}" text-anchor="middle">'
        "average prompt tokens per call</text>"
    )
    return out


def percent_text(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.1f}%"


def _loss_mark(x: float, y: float, title: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    points = f"{x - 4.5:.1f},{y - 5:.1f} {x + 4.5:.1f},{y - 5:.1f} {x:.1f},{y + 3:.1f}"
    look = 'fill="#c92a2a" stroke="white" stroke-width="0.6"'
    return f'<polygon points="{points}" {look}>{tip}</polygon>'


def _loss_marks(calls: Sequence[Mapping[str, Any]], x: Any) -> list[str]:
    """A red mark above the x axis at each call whose sent request had lost a use."""
    out: list[str] = []
    for i, call in enumerate(calls):
        lost = call.get("lost_uses") or 0
        if lost:
            title = f"call {call['index']}: {lost} of {call.get('uses', '?')} uses lost"
            spans = [str(u.get("span", "")) for u in call.get("lost") or ()][:3]
            if spans:
                title += " (" + "; ".join(spans) + ")"
            out.append(_loss_mark(x(i + 1), _BOTTOM - 6, title))
    return out


def _lost_panel(points: Sequence[Mapping[str, Any]], knob: str, top: float) -> list[str]:
    """Under the sweep panel: lost rate against cost, one point per value of the knob, the
    points on the cost x lost-rate frontier filled (no other setting forgets less for no
    more cost)."""
    good = [p for p in points if p.get("error") is None and p.get("lost_rate") is not None]
    if not good:
        return []
    left, right, upper, lower = _LEFT, _RIGHT, top + 50, top + _SWEEP_H - 50
    x_ticks = nice_ticks(max(max(p["cost"] for p in good), 1e-9) * 1.04)
    y_ticks = nice_ticks(max(max(p["lost_rate"] for p in good) * 100, 1.0) * 1.08)

    def x(cost: float) -> float:
        return left + (right - left) * cost / x_ticks[-1]

    def y(rate: float) -> float:
        return lower - (lower - upper) * rate * 100 / y_ticks[-1]

    out = [
        f'<text x="{left}" y="{top + 24}" font-size="14" font-weight="bold">sweep of {knob}: '
        "lost rate against cost</text>",
        f'<line x1="{left}" y1="{lower}" x2="{right}" y2="{lower}" stroke="#333"/>',
        f'<line x1="{left}" y1="{upper}" x2="{left}" y2="{lower}" stroke="#333"/>',
    ]
    out += [
        f'<text x="{x(t):.1f}" y="{lower + 16}" text-anchor="middle" fill="#444">${t:.2f}</text>'
        for t in x_ticks
    ]
    out += [
        f'<text x="{left - 8}" y="{y(t / 100) + 4:.1f}" text-anchor="end" fill="#444">'
        f"{_label(t)}%</text>"
        for t in y_ticks
    ]
    series: dict[str | None, list[Mapping[str, Any]]] = {}
    for p in good:
        series.setdefault(p.get("series"), []).append(p)
    for n, (label, members) in enumerate(series.items()):
        color = _SWEEP_COLORS[n % len(_SWEEP_COLORS)]
        ordered = sorted(members, key=lambda p: p["cost"])
        line = " ".join(f"{x(p['cost']):.1f},{y(p['lost_rate']):.1f}" for p in ordered)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        if label is not None:  # in the legend column, at the right of the panel
            row = upper + 20 * n
            out.append(
                f'<line x1="{right + 24}" y1="{row - 4}" x2="{right + 46}" y2="{row - 4}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
            out.append(f'<text x="{right + 54}" y="{row}">{escape(label)}</text>')
        for p in ordered:
            px, py = x(p["cost"]), y(p["lost_rate"])
            title = (
                f"{knob} {p['value']:g}: ${p['cost']:.4f}, {p['lost_rate'] * 100:.1f}% of "
                f"{p.get('uses', '?')} uses lost"
            )
            hollow = p.get("lost_frontier") is False
            out.append(_marker("circle", px, py, color, title, hollow=hollow))
            out.append(
                f'<text x="{px:.1f}" y="{py - 10:.1f}" text-anchor="middle">{p["value"]:g}</text>'
            )
    out.append(
        f'<text x="{right}" y="{upper - 8}" text-anchor="end" fill="#444">filled: on the '
        "frontier (no other setting forgets less for no more cost)</text>"
    )
    out.append(
        f'<text x="{(left + right) / 2}" y="{lower + 36}" text-anchor="middle">'
        "cost of the replay (USD)</text>"
    )
    return out


def lost_frontier_svg(points: Sequence[Mapping[str, Any]], title: str, knob: str) -> str:
    """A standalone SVG of sweep points (``SweepPoint.to_json()`` dicts with
    ``lost_frontier``, one ``series`` per curve): lost rate against cost, each series a
    line (``benchmarks/bench_forgetting.py`` draws tinyctx's and LangChain's together)."""
    height = _SWEEP_H + 40
    body = _lost_panel(points, knob, 30)
    return (
        "\n".join(
            [
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
                f'viewBox="0 0 {_W} {height}" font-family="DejaVu Sans, Helvetica, Arial, '
                'sans-serif" font-size="12">',
                f'<rect width="{_W}" height="{height}" fill="white"/>',
                f'<text x="{_LEFT}" y="24" font-size="16" font-weight="bold">'
                f"{escape(title)}</text>",
                *body,
                "</svg>",
            ]
        )
        + "\n"
    )


def write_chart(
    payload: Mapping[str, Any], path: Path, name: str, *, stack: str | None = None
) -> None:
    """Write :func:`svg_chart` to ``path`` (UTF-8).

    Args:
        payload: The replay's JSON payload (``tinyctx replay --json``).
        path: The SVG file to write.
        name: The transcript's name, in the title.
        stack: The stack's name, in the facts line, or None.
    """
    path.write_text(svg_chart(payload, name, stack=stack), encoding="utf-8")
