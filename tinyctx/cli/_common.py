"""What every part of the command shares: exit codes, failing with one, its streams."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, NoReturn, TextIO

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    pass


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


class CommandError(Exception):
    """A failure of the command: one line on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CommandError(message, code)


class Streams:
    """The command's streams (the process's, or a test's)."""

    def __init__(self, out: TextIO, err: TextIO, stdin: IO[str]) -> None:
        self.out, self.err, self.stdin = out, err, stdin

    def note(self, text: str) -> None:
        print(f"tinyctx: {text}", file=self.err)


class ParserExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@contextmanager
def progress_bar(
    err: TextIO, total: int | None = None, what: str = "replaying", unit: str = "messages"
) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr (``what done/total unit``), only on a terminal, cleared
    when the work ends. Given the total, it shows it from the start, never ``0/?``.

    Args:
        err: The stream the bar draws on (nothing unless it is a terminal).
        total: How much work there is, or None while unknown.
        what: The bar's label.
        unit: What the counts count.
    """
    if not err.isatty():
        yield None
        return
    from ..render import console  # first: it names the extra when rich is missing

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
