"""The replay table and chart render any payload readably: properties over generated data."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from tinyctx.chart import CHART_SERIES, nice_ticks, svg_chart
from tinyctx.render import CALL_COLUMNS, Column, console, print_replay, table

SVG = "{http://www.w3.org/2000/svg}"


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A replay --json payload: calls with token counts up to 7 digits, actions, a stop,
    and (as with --price) the cache and cost columns."""
    priced = draw(st.booleans())
    window = draw(st.integers(min_value=1_000, max_value=2_000_000))
    reserved = draw(st.integers(min_value=0, max_value=window - 1))
    usable = window - reserved
    calls = []
    for index in range(1, draw(st.integers(min_value=0, max_value=40)) + 1):
        tokens = draw(st.integers(min_value=0, max_value=usable))
        raw = tokens + draw(st.integers(min_value=0, max_value=5_000_000))
        names = draw(st.lists(st.sampled_from(["TrimOldest", "Summarize", "x" * 30]), max_size=3))
        calls.append(
            {
                "index": index,
                "messages": draw(st.integers(min_value=1, max_value=100_000)),
                "tokens": tokens,
                "raw_tokens": raw,
                "utilisation": tokens / usable,
                "window_utilisation": tokens / window,
                "raw_utilisation": raw / usable,
                "saved": raw - tokens,
                "would_overflow": raw > usable,
                "actions": [f"{n} -{index}" for n in names],
                "events": [
                    {"kind": "context.policy_applied", "name": n, "freed_tokens": 1, "label": n}
                    for n in names
                ],
                "lost_of_uses": f"{index % 7}/{index * 11}",
            }
        )
        if priced:
            calls[-1].update(
                cache_read_tokens=draw(st.integers(min_value=0, max_value=tokens)),
                cache_write_tokens=draw(st.integers(min_value=0, max_value=tokens)),
                cost_usd=draw(st.floats(min_value=0, max_value=99.0)),
                break_at=draw(st.none() | st.integers(min_value=0, max_value=999)),
            )
    stopped = draw(st.booleans())
    return {
        "window": window,
        "reserved": reserved,
        "usable": usable,
        "calls": calls,
        "summary": {
            "model_calls": len(calls),
            "recorded_model_calls": len(calls) + (draw(st.integers(1, 50)) if stopped else 0),
            "peak_utilisation": max((c["utilisation"] for c in calls), default=0.0),
            "peak_window_utilisation": max((c["window_utilisation"] for c in calls), default=0.0),
            "would_overflow_without_stack": sum(c["would_overflow"] for c in calls),
            "overflows_avoided": sum(c["would_overflow"] for c in calls),
            "overflows_remaining": 0,
            "total_tokens_saved": sum(c["saved"] for c in calls),
            "final_messages": 3,
            "error": "prompt of ~9 tokens does not fit" if stopped else None,
        },
    }


def _vertical_extent(element: ET.Element) -> tuple[float, float]:
    """A marker's top and bottom y in the SVG."""
    if element.get("cy") is not None:
        cy, r = float(element.get("cy", 0)), float(element.get("r", 0))
        return cy - r, cy + r
    if element.get("height") is not None:
        y = float(element.get("y", 0))
        return y, y + float(element.get("height", 0))
    ys = [float(point.split(",")[1]) for point in (element.get("points") or "").split()]
    return min(ys), max(ys)


class TestTicks:
    """Axis ticks are round, even, start at zero and cover the data."""

    @given(st.floats(min_value=1e-3, max_value=1e9, allow_nan=False))
    def test_ticks_cover_the_top_evenly(self, high: float) -> None:
        """0 first, the last at or above the top, equal steps of 1, 2, 2.5 or 5 x 10^k."""
        ticks = nice_ticks(high)
        assert ticks[0] == 0 and ticks[-1] >= high * (1 - 1e-9)
        steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:], strict=False)}
        assert len(steps) == 1
        assert 2 <= len(ticks) <= 12


class TestTable:
    """The table keeps its columns aligned and its width, whatever the numbers."""

    @given(payloads())
    def test_rows_align_and_fit_80_columns(self, payload: dict[str, Any]) -> None:
        """Numbers end at their column's edge on every row; nothing passes 80 columns."""
        assume(payload["calls"])
        out = io.StringIO()
        print_replay(payload, console(out), "t.jsonl")
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= 80
        header = next(i for i, line in enumerate(lines) if line.startswith("call"))
        rows = [line for line in lines[header + 1 :] if line[:4].strip().isdigit()]
        assert len(rows) == len(payload["calls"])
        edge = lines[header].index("sent") + len("sent")  # right-justified: the column's edge
        for call, line in zip(payload["calls"], rows, strict=True):
            sent = f"{call['tokens']:,}"
            assert line[edge - len(sent) : edge] == sent and line[edge] == " "
            if "cost_usd" in call:  # priced: the cost is whole on its row, never split
                assert f"${call['cost_usd']:.4f}" in line

    def test_priced_actions_go_below_the_table_whole(self) -> None:
        """At 80 columns with --price the actions are listed below the table by call."""
        calls = [
            {
                "index": i,
                "messages": 10 * i,
                "tokens": 23_000 + i,
                "raw_tokens": 45_000,
                "utilisation": 0.8,
                "window_utilisation": 0.7,
                "saved": 22_000,
                "would_overflow": True,
                "cache_read_tokens": 22_000,
                "cache_write_tokens": 1_000,
                "cost_usd": 0.0123,
                "break_at": None,
                "lost_of_uses": "0/12",
                "actions": ["Read result cut to 9137B", "Microcompact -21505"],
            }
            for i in range(1, 4)
        ]
        payload = {"window": 32_000, "reserved": 4_000, "usable": 28_000, "calls": calls}
        payload["summary"] = {"model_calls": 3, "recorded_model_calls": 3, "error": None}
        out = io.StringIO()
        print_replay(payload, console(out), "t.jsonl")
        text = out.getvalue()
        assert max(len(line) for line in text.splitlines()) <= 80
        assert "actions (what the layers did)" in text
        assert "call 2  Read result cut to 9137B; Microcompact -21505" in text
        assert text.count("$0.0123") == 3

    def test_a_registered_column_shows_only_when_its_key_is_there(self) -> None:
        """An extra column (e.g. cost) appears when calls have its key, with its legend."""
        extra = Column("cost_usd", "cost", "dollars per call", "${:.4f}".format)
        rows = [{"index": 1, "cost_usd": 0.0123}, {"index": 2, "cost_usd": None}]
        out = io.StringIO()
        console(out).print(table(rows, [*CALL_COLUMNS, extra]))
        assert "cost" in out.getvalue() and "$0.0123" in out.getvalue()
        out = io.StringIO()
        console(out).print(table([{"index": 1}], [*CALL_COLUMNS, extra]))
        assert "cost" not in out.getvalue()


class TestChart:
    """The chart is well-formed SVG with what a reader needs, for any payload."""

    @given(payloads())
    def test_chart_has_axes_lines_legend_and_stop(self, payload: dict[str, Any]) -> None:
        """Valid XML; ticks on both axes; window and usable lines; a stop marker iff stopped."""
        svg = svg_chart(payload, "t.jsonl", stack="default")
        root = ET.fromstring(svg)
        texts = [t.text or "" for t in root.iter(f"{SVG}text")]
        assert "tinyctx replay: t.jsonl" in texts
        assert "model call (number)" in texts and "prompt size (tokens)" in texts
        assert any(t.startswith(f"window ({payload['window']:,})") for t in texts)
        assert any(t.startswith("usable (") for t in texts) == (payload["reserved"] > 0)
        assert sum(1 for t in texts if t.replace(",", "").isdigit()) >= 4  # tick labels
        stopped = payload["summary"]["error"] is not None
        assert any(t.startswith("stopped:") for t in texts) == stopped
        drawn = len(root.findall(f"{SVG}polyline"))
        shown = [x for x in CHART_SERIES if any(c.get(x.key) is not None for c in payload["calls"])]
        assert drawn == len(shown)  # a series is drawn when the calls carry its key
        names = {e["name"] for c in payload["calls"] for e in c["events"]}
        for name in names:
            assert any(t.startswith(f"{name} (") for t in texts)

    @given(payloads())
    def test_markers_of_two_layers_on_one_call_never_overlap(self, payload: dict[str, Any]) -> None:
        """Each layer that acted on a call has its own marker, overlapping no other's."""
        root = ET.fromstring(svg_chart(payload, "t.jsonl"))
        marks: dict[str, list[tuple[str, float, float]]] = {}  # call -> (label, top, bottom)
        for element in root.iter():
            title = element.find(f"{SVG}title")
            if title is None or not (title.text or "").startswith("call "):
                continue
            call, _, label = (title.text or "").partition(": ")
            marks.setdefault(call, []).append((label, *_vertical_extent(element)))
        for spots in marks.values():
            for i, (label, top, bottom) in enumerate(spots):
                for other, other_top, other_bottom in spots[i + 1 :]:
                    if other != label:
                        assert bottom <= other_top or other_bottom <= top, (label, other)

    def test_numbers_are_never_cut_when_columns_do_not_fit(self) -> None:
        """With many extra columns the lines get wider; every number is printed whole."""
        extra = [Column(f"x{i}", f"extra{i}", f"extra column {i}") for i in range(6)]
        calls = [
            {"index": i, "tokens": 1_234_567 * i, **{f"x{j}": 9_876_543 + j for j in range(6)}}
            for i in range(1, 4)
        ]
        payload = {"window": 2_000_000, "reserved": 0, "usable": 2_000_000, "calls": calls}
        payload["summary"] = {"model_calls": 3, "recorded_model_calls": 3, "error": None}
        out = io.StringIO()
        CALL_COLUMNS.extend(extra)
        try:
            print_replay(payload, console(out), "t.jsonl")
        finally:
            del CALL_COLUMNS[-len(extra) :]
        text = out.getvalue()
        for call in calls:
            assert f"{call['tokens']:,}" in text
            assert all(f"{call[f'x{j}']:,}" in text for j in range(6))
        assert "…" not in text
