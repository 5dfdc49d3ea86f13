"""Crash and approval across real processes on one SQLite file (see tests/durable_worker.py)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# crash trials across real processes: deselected by default, run with `pytest -m slow`
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("durable_worker.py")
TRIALS = 50
BUDGET = 45.0  # seconds of killing; the final check comes after


def _status(directory: Path, lane: str) -> list[str]:
    path = directory / f"status-{lane}.txt"
    return path.read_text().splitlines() if path.exists() else []


class Zygote:
    """The process that forks the workers (imported once, so a trial costs a fork)."""

    def __init__(self, db: Path, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "zygote", str(db), str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pids: list[int] = []

    def spawn(self, lane: str, seed: int) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"spawn {lane} {seed}\nreap\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.startswith("pid "), line
        pid = int(line.split()[1])
        self.pids.append(pid)
        return pid

    def close(self) -> None:
        """Stop every worker still alive (a failed test leaves some), then the zygote."""
        assert self.proc.stdin is not None
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


def wait_checked(directory: Path, lane: str, pid: int, timeout: float = 40.0) -> str:
    """The worker's own verification line (a FAIL line fails the test with its reason)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in _status(directory, lane):
            if line.startswith(("FAIL", "checked")) and f" {pid} " in line:
                assert not line.startswith("FAIL"), line
                return line
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} of lane {lane} did not finish its check in {timeout}s")


class TestCrashes:
    """Workers SIGKILLed at random moments lose nothing committed and break nothing."""

    def test_sigkill_at_random_moments(self, tmp_path: Path) -> None:
        """~50 kills; each new process checks every thread, finishes paused runs in limits."""
        db = tmp_path / "threads.db"
        rng = random.Random(1313)
        lanes = ["A", "B"]
        zygote = Zygote(db, tmp_path)
        trials = 0
        started = time.monotonic()
        try:
            while trials < TRIALS and time.monotonic() - started < BUDGET:
                pids = {lane: zygote.spawn(lane, rng.randrange(1 << 30)) for lane in lanes}
                for lane, pid in pids.items():
                    wait_checked(tmp_path, lane, pid)
                for lane in rng.sample(lanes, len(lanes)):
                    time.sleep(rng.uniform(0.0, 0.25))
                    os.kill(pids[lane], signal.SIGKILL)
                    trials += 1
            final = {lane: zygote.spawn(lane, -1) for lane in lanes}
            for lane, pid in final.items():
                wait_checked(tmp_path, lane, pid, timeout=60.0)
        finally:
            zygote.close()
        checks = [line for lane in lanes for line in _status(tmp_path, lane)]
        assert trials >= 20, f"only {trials} kills fit in the time budget"
        assert len(checks) == trials + len(lanes)
        journal = (tmp_path / "journal.txt").read_text().splitlines()
        effects = (tmp_path / "effects.txt").read_text().split()
        assert len(effects) == len(set(effects))
        resumed = sum(line.count('"resumed') for line in checks)
        print(
            f"\ncrash test: {trials} SIGKILLs in {time.monotonic() - started:.1f}s, "
            f"{len(journal)} model calls, {len(effects)} approved tool runs, "
            f"{resumed} stored checkpoints resumed by a new process"
        )


class TestApprovalAcrossProcesses:
    """An approval pauses one process; a new interpreter resumes it; the tool runs once."""

    def test_process_b_resumes_what_process_a_paused(self, tmp_path: Path) -> None:
        """A runs to the approval and exits; B (a new interpreter) resumes and completes."""
        phase = self.phases(tmp_path)
        assert "paused approval ['deploy']" in phase("approve")
        assert not (tmp_path / "deploys.txt").exists()
        assert "resumed completed deployed, all done" in phase("resume")
        deploys = (tmp_path / "deploys.txt").read_text().splitlines()
        assert len(deploys) == 1

    def test_a_subagents_review_is_decided_in_another_process(self, tmp_path: Path) -> None:
        """A's sub-agent pauses for review and A exits; B resumes the parent with the
        reviewer's decision, which reaches the sub-agent; the reviewed call runs once, in B."""
        phase = self.phases(tmp_path)
        assert "paused helper/Approvals ['d1']" in phase("sub-approve")
        assert not (tmp_path / "deploys.txt").exists()
        assert "resumed completed parent done" in phase("sub-resume")
        deploys = (tmp_path / "deploys.txt").read_text().splitlines()
        assert len(deploys) == 1
        assert "process B found no paused run" in phase("sub-resume", ok=False)
        assert len((tmp_path / "deploys.txt").read_text().splitlines()) == 1

    @staticmethod
    def phases(tmp_path: Path) -> Callable[..., str]:
        db = str(tmp_path / "ops.db")

        def phase(name: str, ok: bool = True) -> str:
            done = subprocess.run(
                [sys.executable, str(WORKER), name, db, str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if not ok:
                assert done.returncode != 0
                return done.stderr
            assert done.returncode == 0, done.stderr
            return done.stdout

        return phase
