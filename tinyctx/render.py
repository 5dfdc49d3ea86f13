"""How ``tinyctx replay`` and ``tinyctx stats`` look in a terminal (rich tables, colour only
on a terminal, ``NO_COLOR`` honoured, fitted to the terminal's width).

Everything renders from the command's stable JSON payload (``ReplayReport.to_json()``):
a column, a summary line or a chart series is shown when its key is in the payload. To show
more data, add a key to each call dict (or to the summary) and register how it looks::

    from tinyctx.render import CALL_COLUMNS, Column
    CALL_COLUMNS.append(Column("cost_usd", "cost", "dollars per call", fmt="${:.4f}".format))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TextIO

from attrs import frozen

try:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "the tinyctx command needs rich: pip install 'tinyctx[cli]'", name=exc.name
    ) from exc

__all__ = [
    "Column",
    "SummaryItem",
    "CALL_COLUMNS",
    "SUMMARY_ITEMS",
    "SWEEP_COLUMNS",
    "console",
    "number",
    "percent",
    "print_replay",
    "print_stats",
    "table",
]

Justify = Literal["left", "right", "center"]


def number(value: Any) -> str:
    """An integer with thousands separators (``121,662``)."""
    return f"{value:,}"


def percent(value: Any) -> str:
    return f"{value * 100:.1f}%"


@frozen
class Column:
    """One column of the replay table: the call dict's ``key``, its header and legend line.

    ``style`` picks a rich style from the whole call dict (e.g. red when it would overflow);
    a column is shown when some call has its key with a value other than None.
    """

    key: str
    header: str
    legend: str
    fmt: Callable[[Any], str] = number
    justify: Justify = "right"
    style: Callable[[Mapping[str, Any]], str] | None = None
    wrap: bool = False


@frozen
class SummaryItem:
    """One line of the replay summary: the summary dict's ``key`` and its label."""

    key: str
    label: str
    fmt: Callable[[Any], str] = number


def _over(call: Mapping[str, Any]) -> str:
    return "bold red" if call.get("would_overflow") else ""


def _heat(call: Mapping[str, Any]) -> str:
    value = call.get("utilisation") or 0.0
    return "red" if value > 1.0 else "yellow" if value >= 0.9 else "green"


CALL_COLUMNS: list[Column] = [
    Column("index", "call", "model call number"),
    Column("messages", "msgs", "messages sent to the model"),
    Column("tokens", "sent", "tokens sent to the model, after the stack"),
    Column("window_utilisation", "%win", "sent / the whole window", percent, style=_heat),
    Column("utilisation", "%usable", "sent / the usable window", percent, style=_heat),
    Column("raw_tokens", "raw", "tokens without the stack", style=_over),
    Column(
        "would_overflow",
        "!",
        "raw is over the usable window: would overflow without the stack",
        lambda v: "!" if v else "",
        "left",
        style=_over,
    ),
    Column("saved", "saved", "raw - sent: tokens the stack kept out"),
    # with --price (tinyctx.cost)
    Column("cache_read_tokens", "read", "tokens read from the provider's prompt cache"),
    Column("cache_write_tokens", "written", "tokens written to the prompt cache"),
    Column("cost_usd", "cost", "this call's cost in USD at --price", "${:.4f}".format),
    Column(
        "break_at",
        "break",
        "the cached prefix broke at this message index (a layer rewrote it)",
        lambda v: "" if v is None else f"@{v}",
        style=lambda call: "yellow" if call.get("prefix_broke") else "",
    ),
    Column("imgs", "imgs", "images sent / images in the recording so far", str),
    Column(
        "lost_of_uses",
        "lost",
        "uses lost / uses: the reply's spans of earlier context the request no longer held",
        str,
        style=lambda call: "bold red" if call.get("lost_uses") else "",
    ),
    Column("actions", "actions", "what the layers did", "; ".join, "left", wrap=True),
]
"""The replay table's columns, in order. Append to show a key you added to each call."""

SUMMARY_ITEMS: list[SummaryItem] = [
    SummaryItem("peak_window_utilisation", "peak utilisation of the window", percent),
    SummaryItem("peak_utilisation", "peak utilisation of the usable window", percent),
    SummaryItem("would_overflow_without_stack", "calls over the usable window without the stack"),
    SummaryItem("overflows_avoided", "  kept inside it by the stack"),
    SummaryItem("overflows_remaining", "calls over it even with the stack"),
    SummaryItem("total_tokens_saved", "tokens saved over all calls"),
    SummaryItem("uses", "uses of earlier context by the recorded replies"),
    SummaryItem("lost_uses", "  lost: their span was not in the sent request"),
    SummaryItem("lost_rate", "lost rate (lost uses / uses)", percent),
    # with --price (tinyctx.cost)
    SummaryItem("average_prompt_tokens", "average prompt tokens", lambda v: f"{v:,.0f}"),
    SummaryItem("cache_read_tokens", "tokens read from the prompt cache"),
    SummaryItem("cache_write_tokens", "tokens written to the prompt cache"),
    SummaryItem("uncached_tokens", "tokens billed as plain input"),
    SummaryItem("prefix_breaks", "calls that broke the cached prefix"),
    SummaryItem("total_cost_usd", "total cost in USD", "${:.4f}".format),
]
"""The replay summary's lines, in order (after "N of M calls replayed")."""


SWEEP_COLUMNS: list[Column] = [
    Column("value", "low_water", "the knob's value", "{:g}".format),
    Column("series", "with", "the other settings of the point", str, "left"),
    Column("average_prompt_tokens", "avg prompt", "tokens sent per call", lambda v: f"{v:,.0f}"),
    Column("cost", "cost", "USD for the replay", "${:.4f}".format),
    Column("prefix_breaks", "breaks", "calls that broke the cached prefix"),
    Column("lost_rate", "lost", "lost uses / uses (tinyctx.forgetting)", percent),
    Column("calls", "calls", "model calls replayed"),
    Column("error", "stopped", "why the replay stopped", str, "left", wrap=True),
    Column(
        "frontier",
        "pick",
        "on the curve: no other setting keeps as much context for less",
        lambda on: "*" if on else "",
        "center",
    ),
    Column(
        "lost_frontier",
        "pick lost",
        "on the cost x lost-rate curve: no other setting forgets less for no more cost",
        lambda on: "*" if on else "",
        "center",
    ),
]
"""The ``--sweep`` table's columns."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit the process; the command decides (quietly, its own exit code)
        self.quiet = True
        raise BrokenPipeError


def console(stream: TextIO, *, stderr: bool = False) -> Console:
    """A rich console on ``stream``: colour and the terminal's width only on a terminal;
    80 columns (or ``COLUMNS``) otherwise; ``NO_COLOR`` / ``FORCE_COLOR`` honoured. A closed
    pipe raises :class:`BrokenPipeError` to the caller."""
    return _Console(file=stream, stderr=stderr, highlight=False, soft_wrap=False)


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    gap: int = 2,
) -> Table:
    """A rich table of ``rows`` (dicts) with those of ``columns`` that some row has,
    ``gap`` spaces between columns (2 or 1)."""
    shown = [c for c in columns if any(row.get(c.key) is not None for row in rows)]
    cells = [
        [
            Text(
                "" if row.get(c.key) is None else c.fmt(row[c.key]),
                style=c.style(row) if c.style else "",
            )
            for c in shown
        ]
        for row in rows
    ]
    grid = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=None,
        pad_edge=False,
        padding=(0, 1) if gap == 2 else (0, 1, 0, 0),
    )
    for i, column in enumerate(shown):
        # a number is never cut: its column is as wide as its widest value; only the
        # wrapping column (the actions) gives way to the terminal's width
        widest = max([len(column.header), *(len(line[i]) for line in cells)])
        grid.add_column(
            column.header,
            justify=column.justify,
            no_wrap=not column.wrap,
            overflow="fold",
            ratio=1 if column.wrap else None,
            min_width=12 if column.wrap else widest,
        )
    for line in cells:
        grid.add_row(*line)
    return grid


NARROW_HIDDEN: list[str] = ["window_utilisation", "messages", "cache_write_tokens"]
"""The call columns hidden, in turn, when the table would not fit the width otherwise
(``--json`` has every field)."""


def _need(grid: Table, gap: int) -> int:
    return sum(c.min_width or 0 for c in grid.columns) + gap * (len(grid.columns) - 1)


def _fitted(calls: Sequence[Mapping[str, Any]], width: int) -> tuple[Table, list[Column], bool]:
    """The call table fitted to ``width``, the columns it shows and whether the actions
    go below it. A number is never cut and no line is wider than ``width``: when the
    columns do not fit, the actions move below the table, the gap narrows to one space,
    then the :data:`NARROW_HIDDEN` columns go, one at a time."""
    columns = list(CALL_COLUMNS)
    grid = table(calls, columns)
    if _need(grid, 2) <= width:
        return grid, columns, False
    columns = [c for c in columns if not c.wrap]
    gap = 2 if _need(table(calls, columns), 2) <= width else 1
    for key in NARROW_HIDDEN:
        if _need(table(calls, columns, gap=gap), gap) <= width:
            break
        columns = [c for c in columns if c.key != key]
    return table(calls, columns, gap=gap), columns, True


def _key(header: str) -> str:
    return next(c.key for c in CALL_COLUMNS if c.header == header)


def _actions_below(calls: Sequence[Mapping[str, Any]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(overflow="fold")
    for call in calls:
        if call.get("actions"):
            grid.add_row(f"call {call['index']}", "; ".join(call["actions"]))
    return grid


def _legend(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(style="dim")
    for column in columns:
        if any(row.get(column.key) is not None for row in rows):
            grid.add_row(column.header, column.legend)
    return grid


def print_replay(payload: Mapping[str, Any], out: Console, name: str) -> None:
    """The replay table, its legend and summary, from the ``--json`` payload."""
    calls: list[Mapping[str, Any]] = payload["calls"]
    summary: Mapping[str, Any] = payload["summary"]
    window, reserved, usable = payload["window"], payload["reserved"], payload["usable"]
    out.print(Text.assemble(("replay of ", "bold"), (name, "bold cyan")))
    if window is not None:
        out.print(
            f"window {number(window)} - reserved {number(reserved)} = usable "
            f"{number(usable)} tokens"
        )
    out.print()
    grid, shown, below = _fitted(calls, out.width)
    width = out.width
    if _need(grid, 1) > width:
        out.width = _need(grid, 1)  # narrower than the numbers: wider lines, none cut
    out.print(grid)
    out.width = width
    if below and any(call.get("actions") for call in calls):
        out.print()
        out.print(Text("actions (what the layers did)", style="bold"))
        out.print(_actions_below(calls))
    out.print()
    out.print(_legend(shown, calls))
    hidden = [c.header for c in CALL_COLUMNS if c not in shown and not c.wrap]
    hidden = [h for h in hidden if any(r.get(_key(h)) is not None for r in calls)]
    if hidden:
        note = f"hidden to fit {width} columns: {', '.join(hidden)} (--json has every field)"
        out.print(Text(note, style="dim"))
    out.print()
    out.print(_summary(summary))
    if summary.get("estimated_by"):  # provider-side layers replayed by their documented rules
        note = (
            f"estimate: {', '.join(summary['estimated_by'])} applied the provider's rules locally"
        )
        out.print(Text(note, style="yellow"))
    sweep = payload.get("sweep")
    if sweep:
        out.print()
        out.print(
            table(
                sweep["points"],
                SWEEP_COLUMNS,
                title=f"sweep of {sweep['knob']}: average prompt tokens and lost rate against cost",
            )
        )


def replayed(summary: Mapping[str, Any]) -> str:
    """``N of M`` model calls replayed."""
    done, recorded = summary["model_calls"], summary.get("recorded_model_calls")
    return f"{done:,} of {recorded:,}" if recorded is not None else f"{done:,}"


def _summary(summary: Mapping[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(justify="right", style="bold", no_wrap=True)
    stopped = " (stopped)" if summary.get("error") else ""
    grid.add_row("model calls replayed", replayed(summary) + stopped)
    for item in SUMMARY_ITEMS:
        value = summary.get(item.key)
        if value is not None:
            grid.add_row(item.label, item.fmt(value))
    return grid


def _plural(count: int, noun: str) -> str:
    return f"{number(count)} {noun}{'' if count == 1 else 's'}"


def print_stats(payload: Mapping[str, Any], out: Console, name: str) -> None:
    """``tinyctx stats``: counts, tokens by role, tool results by tool, the largest results."""
    # the name on its own line (like replay's header), so the counts never wrap mid-phrase
    out.print(Text.assemble(("stats of ", "bold"), (name, "bold cyan")))
    counts = [
        _plural(payload["messages"], "message"),
        _plural(payload["user_turns"], "user turn"),
        _plural(payload["model_turns"], "model turn"),
        _plural(payload["tool_calls"], "tool call"),
    ]
    out.print(", ".join(counts))
    if payload.get("images") or payload.get("documents"):
        out.print(
            f"{_plural(payload['images'], 'image')}, {_plural(payload['documents'], 'document')}:"
            f" {number(payload['media_tokens'])} tokens (heuristic)"
        )
    real: Mapping[str, int] | None = payload["tokens_by_role_tokenizer"]
    roles = _section("tokens by role")
    roles.add_column("role")
    roles.add_column("heuristic", justify="right")
    if real is not None:
        roles.add_column("tokenizer", justify="right")
        roles.add_column("heuristic error", justify="right")
    by_role: Mapping[str, int] = payload["tokens_by_role"]
    for role, tokens in by_role.items():
        cells = [role, number(tokens)]
        if real is not None:
            cells += [number(real.get(role, 0)), _error(tokens, real.get(role, 0))]
        roles.add_row(*cells)
    total = sum(by_role.values())
    totals = ["total", number(total)]
    if real is not None:
        totals += [number(sum(real.values())), _error(total, sum(real.values()))]
    roles.add_section()
    roles.add_row(*totals, style="bold")
    _show(out, "tokens by role", roles)
    tools = _section("tool results by tool")
    tools.add_column("tool", overflow="fold")
    tools.add_column("tokens", justify="right")
    tools.add_column("calls", justify="right")
    calls: Mapping[str, int] = payload["calls_by_tool"]
    for tool, tokens in payload["tool_result_tokens_by_tool"].items():
        tools.add_row(tool, number(tokens), number(calls.get(tool, 0)))
    _show(out, "tool results by tool", tools)
    largest = _section("largest tool results")
    largest.add_column("tokens", justify="right")
    largest.add_column("tool", overflow="fold")
    largest.add_column("tool call id", overflow="fold")
    for entry in payload["largest_tool_results"]:
        largest.add_row(number(entry["tokens"]), entry["tool"], entry["tool_call_id"])
    _show(out, "largest tool results", largest)


def _section(title: str) -> Table:
    return Table(box=None, pad_edge=False, header_style="dim", caption=None)


def _show(out: Console, title: str, grid: Table) -> None:
    out.print()
    out.print(Text(title, style="bold"))
    out.print(grid)


def _error(heuristic: int, real: int) -> str:
    return f"{(heuristic - real) / real * 100:+.1f}%" if real else "-"
