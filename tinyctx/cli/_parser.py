"""The command line: argparse writing to the command's streams, each command's flags."""

from __future__ import annotations

import argparse
import difflib
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    pass
from ._common import (
    BUNDLED,
    COMMANDS,
    DEFAULT_WINDOW,
    EXIT_CODES,
    FORMAT_HELP,
    MAX_DEFAULT_RESERVE,
    ParserExit,
    Streams,
)
from ._inputs import looks_like_path


class _Parser(argparse.ArgumentParser):
    """argparse writing to the command's streams and returning instead of exiting."""

    io: Streams

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (self.io.err if file is sys.stderr else self.io.out).write(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self.io.err.write(message)
        raise ParserExit(status)


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


def _new(prog: str, description: str, epilog: str, io: Streams) -> _Parser:
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


def replay_parser(io: Streams) -> _Parser:
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


def stats_parser(io: Streams) -> _Parser:
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


def top_parser(io: Streams) -> _Parser:
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


def unknown_command(word: str) -> str | None:
    """Why ``word`` is not a transcript but a mistyped command, or None."""
    if word == "-" or word.startswith("-") or Path(word).exists() or looks_like_path(word):
        return None
    if "." in word or "/" in word:
        return None  # a missing file: reported as such when loading
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown command {word!r} (commands: {', '.join(COMMANDS)}; or a transcript file){hint}"
