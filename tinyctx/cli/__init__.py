"""The ``tinyctx`` command: replay a real transcript through a stack of layers.

    tinyctx                      replay the bundled transcript through the default stack
    tinyctx replay [TRANSCRIPT|-] [--window N] [--reserve N] [--stack NAME|FILE]
                   [--tokenizer FILE|HUB-NAME] [--format NAME] [--json] [--plot FILE.svg]
                   [--price MODEL] [--prices FILE.toml] [--sweep [0.2,0.4,...]]
    tinyctx stats TRANSCRIPT|- [--tokenizer FILE|HUB-NAME] [--json]

Stacks and layers are found by name through entry points (``tinyctx.stacks`` and
``tinyctx.layers``), so the kernel knows no concrete layer and an application can register
its own layers for ``--stack FILE``. Every failure is one line on stderr and an exit code
of its own (:data:`EXIT_CODES`); output to a closed pipe ends quietly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import IO, TextIO

from ._commands import cmd_replay, cmd_stats
from ._common import (
    BUNDLED,
    COMMANDS,
    DEFAULT_WINDOW,
    EXIT_CODES,
    EXIT_EMPTY,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT,
    EXIT_PIPE,
    EXIT_STOPPED,
    EXIT_TOKENIZER,
    EXIT_USAGE,
    FORMAT_HELP,
    HUB_TIMEOUT,
    MAX_DEFAULT_RESERVE,
    CommandError,
    ParserExit,
    Streams,
    default_reserve,
    fail,
)
from ._inputs import DEFAULT_SWEEP, bundled_transcript
from ._parser import replay_parser, stats_parser, top_parser, unknown_command
from ._stacks import StackError, StackFactory, load_stack, load_stack_at

__all__ = [
    "main",
    "load_stack",
    "load_stack_at",
    "StackError",
    "bundled_transcript",
    "default_reserve",
    "EXIT_CODES",
    # the other module-level names of the one-file command, importable from here as before
    "BUNDLED",
    "COMMANDS",
    "DEFAULT_SWEEP",
    "DEFAULT_WINDOW",
    "EXIT_EMPTY",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "EXIT_PIPE",
    "EXIT_STOPPED",
    "EXIT_TOKENIZER",
    "EXIT_USAGE",
    "FORMAT_HELP",
    "HUB_TIMEOUT",
    "MAX_DEFAULT_RESERVE",
    "CommandError",
    "StackFactory",
]


def _run(argv: list[str], io: Streams) -> int:
    top = top_parser(io)
    if argv and argv[0] in ("-h", "--help", "--version"):
        top.parse_args(argv[:1])
    if argv and argv[0] in COMMANDS:
        command, rest = argv[0], argv[1:]
    else:
        mistake = unknown_command(argv[0]) if argv else None
        if mistake is not None:
            top.print_usage(io.err)
            fail(mistake)
        command, rest = "replay", argv
    if command == "stats":
        return cmd_stats(stats_parser(io).parse_args(rest), io)
    return cmd_replay(replay_parser(io).parse_args(rest), io)


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test's stream)
        pass


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: IO[str] | None = None,
) -> int:
    """Run the command; returns the exit code (see :data:`EXIT_CODES`).

    Args:
        argv: The arguments after the program's name (``sys.argv[1:]`` when None).
        out: Where output goes (stdout when None).
        err: Where notes, progress and errors go (stderr when None).
        stdin: Where ``-`` reads a transcript from (stdin when None).
    """
    io = Streams(out or sys.stdout, err or sys.stderr, stdin or sys.stdin)
    try:
        return _run(list(sys.argv[1:] if argv is None else argv), io)
    except ParserExit as exit_:
        return exit_.code
    except CommandError as exc:
        io.note(f"error: {exc}")
        return exc.code
    except BrokenPipeError:
        if out is None:
            _quiet_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        io.note("interrupted")
        return EXIT_INTERRUPTED
