"""The installed ``tinyctx`` console script, run as a user runs it: in a subprocess, through
real pipes (closed early), a pseudo-terminal, stdin, and a loopback port for the hub."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import reserved_port
from tinyctx.cli import EXIT_CODES, FORMAT_HELP
from tinyctx.formats import FORMATS, read_transcript

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
BIN = Path(sys.executable).parent / "tinyctx"
TINYCTX = str(BIN if BIN.exists() else shutil.which("tinyctx"))
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-9]|9[0-7]|38;)[0-9;]*m")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    base.update({"COLUMNS": "80", **extra})
    return base


def run(*args: str, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TINYCTX, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env(**extra),
        timeout=120,
    )


def closed_early(args: list[str], lines: int) -> tuple[int, list[str], str]:
    """Run with stdout on a small real pipe; read ``lines`` lines, then close it."""
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)  # smaller than any full output
    process = subprocess.Popen(
        [TINYCTX, *args], stdout=write_fd, stderr=subprocess.PIPE, env=env(), text=True
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "r", encoding="utf-8") as reader:
        head = [reader.readline() for _ in range(lines)]
    _, err = process.communicate(timeout=120)
    return process.returncode, head, err


def one_line(err: str) -> str:
    """stderr holds exactly one line and no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


class TestClosedPipes:
    """A reader that goes away (`| head`) ends the command quietly, as Unix tools do."""

    @pytest.mark.parametrize(
        ("args", "lines"),
        [([], 3), (["replay", "--json"], 2)],
        ids=["table", "json"],
    )
    def test_head_closes_the_pipe_and_nothing_is_reported(
        self, args: list[str], lines: int
    ) -> None:
        """Exit 141 (SIGPIPE's status), nothing on stderr, the lines read were real output."""
        code, head, err = closed_early(args, lines)
        assert err == ""
        assert code == 141
        assert all(head) and len(head) == lines


class TestOneLineErrors:
    """Each failure is one clear line on stderr and an exit code of its own."""

    def test_a_mistyped_command_is_named_with_a_suggestion(self) -> None:
        """`tinyctx frobnicate` is an unknown command, not a missing file; `stast` suggests."""
        result = run("frobnicate")
        assert result.returncode == 2
        assert (
            "unknown command 'frobnicate'" in result.stderr and "no such file" not in result.stderr
        )
        assert "did you mean 'stats'" in run("stast", "x").stderr

    def test_a_directory_is_reported_as_a_directory(self, tmp_path: Path) -> None:
        """A directory as the transcript: 'is a directory', exit 3."""
        result = run(str(tmp_path))
        assert result.returncode == 3
        assert "is a directory" in one_line(result.stderr)

    def test_a_missing_file_exits_3(self, tmp_path: Path) -> None:
        """A transcript that does not exist: 'no such file', exit 3."""
        result = run(str(tmp_path / "missing.jsonl"))
        assert result.returncode == 3 and "no such file" in one_line(result.stderr)

    def test_dash_reads_the_transcript_from_stdin(self) -> None:
        """`tinyctx replay -` replays what arrives on stdin."""
        text = (DATA / "tau_bench_results.json").read_text()
        result = run("replay", "-", "--json", stdin=text)
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        assert payload["transcript"] == "-" and payload["summary"]["model_calls"] == 4
        assert "replay of <stdin>" in run("-", stdin=text).stdout

    def test_a_missing_tokenizer_path_is_a_file_error(self) -> None:
        """--tokenizer /nonexistent/tok.json: 'no such file', not a hub repo-id message."""
        result = run("--tokenizer", "/nonexistent/tok.json")
        assert result.returncode == 4
        line = one_line(result.stderr)
        assert "no such file" in line and "repo" not in line.lower()

    def test_an_offline_hub_name_fails_fast_with_a_hint(self, tmp_path: Path) -> None:
        """HF_HUB_OFFLINE and no cached copy: exit 4 at once, naming the variable."""
        result = run("--tokenizer", "Qwen/Qwen2.5-7B", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
        assert result.returncode == 4
        assert "HF_HUB_OFFLINE" in one_line(result.stderr)

    def test_an_unreachable_hub_fails_fast_with_a_hint(self, tmp_path: Path) -> None:
        """A hub that does not answer (a closed loopback port): exit 4 with what to do."""
        endpoint = f"http://127.0.0.1:{reserved_port()}"
        result = run("--tokenizer", "org/model", HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path))
        assert result.returncode == 4
        line = one_line(result.stderr)
        assert "cannot reach 127.0.0.1" in line and "HF_HUB_OFFLINE=1" in line

    def test_a_hub_name_in_the_local_cache_loads_offline(
        self, tmp_path: Path, shared_data: Path
    ) -> None:
        """A hub name already downloaded is read from the cache, offline."""
        snapshot = tmp_path / "hub" / "models--acme--tok" / "snapshots" / "abc123"
        snapshot.mkdir(parents=True)
        tokenizer = shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        shutil.copy(tokenizer, snapshot / "tokenizer.json")
        result = run(
            "stats",
            str(DATA / "claude_code_session.jsonl"),
            "--tokenizer",
            "acme/tok",
            "--json",
            HF_HUB_OFFLINE="1",
            HF_HOME=str(tmp_path),
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["tokens_by_role_tokenizer"]["user"] > 0

    def test_an_unknown_replay_flag_shows_the_replay_usage(self) -> None:
        """`tinyctx --bogus` and `tinyctx replay --bogus` show replay's usage, exit 2."""
        for args in (["--bogus"], ["replay", "--bogus"]):
            result = run(*args)
            assert result.returncode == 2
            assert "usage: tinyctx replay" in result.stderr and "--bogus" in result.stderr

    @pytest.mark.parametrize(
        ("target", "message"),
        [("nodir/x.svg", "no such directory"), (".", "is a directory"), ("x.png", ".svg")],
    )
    def test_a_bad_plot_path_fails_before_the_replay(
        self, tmp_path: Path, target: str, message: str
    ) -> None:
        """--plot into a missing directory, onto a directory, or not .svg: exit 6, no table."""
        result = run("--plot", str(tmp_path / target))
        assert result.returncode == 6
        assert message in one_line(result.stderr)
        assert result.stdout == ""

    def test_an_empty_transcript_exits_5_with_a_warning(self, tmp_path: Path) -> None:
        """An empty file, or one with no model answer, replays nothing: exit 5, said so."""
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        result = run(str(empty))
        assert result.returncode == 5 and "no messages" in one_line(result.stderr)
        only_user = tmp_path / "user.jsonl"
        only_user.write_text('{"role": "user", "content": "hi"}\n')
        result = run(str(only_user))
        assert result.returncode == 5 and "no model answer" in one_line(result.stderr)


class TestOddResults:
    """Defaults that work and a summary that says what happened."""

    def test_a_small_window_alone_works_with_the_default_reserve(self) -> None:
        """--window 4000 alone replays: the default reserve is an eighth of the window."""
        result = run("--window", "4000", "--json")
        assert result.returncode in (0, 1), result.stderr
        payload = json.loads(result.stdout)
        assert payload["reserved"] == 500 and payload["usable"] == 3500
        default = run("--json").stdout
        assert default and json.loads(default)["reserved"] == 4000

    def test_a_stopped_replay_reports_on_stderr_and_counts_calls(self) -> None:
        """The stop reason is on stderr; the summary says N of M model calls replayed."""
        path = DATA.parent.parent / "tinyctx" / "data" / "marot__spotter__cc-main-4d5611e5.jsonl"
        result = run(str(path), "--window", "1500", "--reserve", "500")
        assert result.returncode == 1
        assert "stopped:" not in result.stdout
        assert "tinyctx: stopped: prompt of ~" in result.stderr
        match = re.search(r"model calls replayed\s+(\d+) of (\d+) \(stopped\)", result.stdout)
        assert match and int(match[1]) < int(match[2]) == 139


class TestHelp:
    """--help lists every format, the defaults and the exit codes; --version answers."""

    def test_help_lists_formats_defaults_and_exit_codes(self) -> None:
        """Top-level and replay help name every format (Claude Code too) and the codes."""
        top, replay_help = run("--help").stdout, run("replay", "--help").stdout
        for text in (top, replay_help):
            for name in FORMATS:
                assert name in text
            assert "Claude Code" in text
            for code in EXIT_CODES:
                assert re.search(rf"^\s+{code}\s", text, re.MULTILINE), code
        flat = " ".join(replay_help.split())
        assert "(default: 32000)" in flat and "(default: default)" in flat
        assert "(default: window/8, at most 4000)" in flat
        assert sorted(FORMAT_HELP) == sorted(FORMATS)

    def test_version(self) -> None:
        """`tinyctx --version` prints the installed version."""
        result = run("--version")
        assert result.returncode == 0
        assert re.fullmatch(r"tinyctx \d+\.\d+\S*\n", result.stdout)

    def test_the_readme_names_every_format(self) -> None:
        """The README tells users which transcripts the command reads."""
        readme = (ROOT / "README.md").read_text()
        for words in ("Claude Code", "OpenHands", "tau-bench", "SWE-agent", "mini-swe-agent"):
            assert words in readme


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^\s*\d+\s+\d+\s", line)]


@pytest.mark.slow  # whole-transcript replays through the command: CI's slow group runs it
class TestReadableOutput:
    """A table with a legend, aligned for big numbers, fitted to the width, coloured on a tty."""

    def test_columns_stay_aligned_with_six_digit_numbers(self) -> None:
        """Every numeric column ends at the same place on every row, 6-digit values too."""
        rows = _rows(run().stdout)
        assert any(re.search(r"\d{3},\d{3}", row) for row in rows)  # 6 digits reached
        ends = {tuple(m.end() for m in re.finditer(r"[\d,.]+%?", row[:60])) for row in rows}
        assert len({e[:6] for e in ends}) == 1

    def test_fits_80_columns_and_has_a_legend(self) -> None:
        """No line is wider than 80 columns; every column header is explained below."""
        out = run().stdout
        assert max(len(line) for line in out.splitlines()) <= 80
        header = next(line for line in out.splitlines() if line.startswith("call"))
        legend = out.split(header, 1)[1]
        for name in header.split():
            assert re.search(rf"^{re.escape(name)}\s+\S", legend, re.MULTILINE), name
        assert "%win" in header and "%usable" in header
        assert re.search(r"^%usable\s+sent / the usable window", legend, re.MULTILINE)

    def test_colour_only_on_a_terminal_and_never_with_no_color(self) -> None:
        """Piped output has no escape codes; a pty gets colour unless NO_COLOR is set."""
        # the same small transcript piped and on a terminal: only the terminal gets colour
        assert "\x1b[" not in run(str(DATA / "claude_code_session.jsonl")).stdout
        assert ANSI_COLOUR.search(_on_a_tty([]))
        assert not ANSI_COLOUR.search(_on_a_tty([], NO_COLOR="1"))

    def test_stats_speaks_english_aligns_and_totals(self, tmp_path: Path) -> None:
        """'1 user turn', long tool names aligned, and a total line in heuristic mode."""
        long_name = "mcp__github__search_code_in_repository"
        transcript = tmp_path / "t.jsonl"
        lines = [
            {"role": "user", "content": "find it"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": long_name, "arguments": "{}"},
                    },
                    {"id": "b", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "x" * 4000},
            {"role": "tool", "tool_call_id": "b", "content": "y" * 40},
            {"role": "assistant", "content": "done"},
        ]
        transcript.write_text("".join(json.dumps(line) + "\n" for line in lines))
        out = run("stats", str(transcript)).stdout
        assert "1 user turn," in out and "2 model turns" in out and "2 tool calls" in out
        rows = [line for line in out.splitlines() if line.startswith((long_name, "ls "))]
        assert len(rows) == 2 and len({len(r.rstrip()) for r in rows}) == 1
        assert re.search(r"^total\s+[\d,]+\s*$", out, re.MULTILINE)


def _on_a_tty(args: list[str], **extra: str) -> str:
    """The command's stdout when it is a terminal (a pseudo-terminal read to the end)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [TINYCTX, *args, str(DATA / "claude_code_session.jsonl")],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=env(TERM="xterm-256color", **extra),
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


class TestFormats:
    """OpenHands, tau-bench and Claude Code files are recognised and replay."""

    def test_openhands_output_is_recognised_and_rebuilt(self) -> None:
        """An output.jsonl record is OpenHands (not SWE-agent); one message per response."""
        transcript = read_transcript(DATA / "openhands_output.jsonl")
        assert transcript.format == "openhands"
        roles = [m.role for m in transcript.messages]
        assert roles == [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        first = transcript.messages[2]
        assert [c.name for c in first.tool_calls] == ["execute_bash", "str_replace_editor"]  # type: ignore[attr-defined]
        assert transcript.info["instance_id"] == "example__repo-101"
        assert read_transcript(DATA / "openhands_output.jsonl", record=1).info["instance_id"] == (
            "example__repo-202"
        )

    def test_tau_bench_results_are_recognised(self) -> None:
        """A tau-bench results file is read from its 'traj'; --record picks the task."""
        transcript = read_transcript(DATA / "tau_bench_results.json", record=1)
        assert transcript.format == "tau_bench" and transcript.info["task_id"] == 1
        assert [m.role for m in transcript.messages][:3] == ["system", "user", "assistant"]

    @pytest.mark.parametrize(
        "name", ["openhands_output.jsonl", "tau_bench_results.json", "claude_code_session.jsonl"]
    )
    def test_each_fixture_replays_through_the_command(self, name: str) -> None:
        """The command replays every recorded model call of each fixture."""
        result = run(str(DATA / name), "--json")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)["summary"]
        assert summary["model_calls"] == summary["recorded_model_calls"] > 0

    @pytest.mark.slow  # every shared transcript replayed whole: CI's slow group runs it
    def test_every_raw_shared_transcript_replays(self, shared_data: Path) -> None:
        """Every raw file in the shared data replays through the installed command."""
        for path in sorted((shared_data / "transcripts" / "raw").iterdir()):
            result = run(str(path), "--json")
            assert result.returncode == 0, (path.name, result.stderr)
            summary = json.loads(result.stdout)["summary"]
            assert summary["model_calls"] == summary["recorded_model_calls"], path.name
            assert summary["error"] is None and summary["overflows_remaining"] == 0, path.name


class TestJsonDocumented:
    """`--json` is a documented contract: every field it prints is in docs/cli.md."""

    def test_every_replay_and_stats_field_is_documented(self) -> None:
        """Each key of the payload, a call, an event, the summary and stats has a row."""
        documented = set(re.findall(r"`(\w+)`", (ROOT / "docs" / "cli.md").read_text()))
        result = run("replay", "--json", "--window", "8000")
        payload = json.loads(result.stdout)
        keys = set(payload) | set(payload["summary"])
        keys |= {k for call in payload["calls"] for k in call}
        keys |= {k for call in payload["calls"] for e in call["events"] for k in e}
        stats = json.loads(run("stats", str(DATA / "openhands_output.jsonl"), "--json").stdout)
        keys |= set(stats) | {k for e in stats["largest_tool_results"] for k in e}
        assert keys - documented == set()
