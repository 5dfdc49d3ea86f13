"""What importing tinyctx costs a process, next to a bare interpreter start.

Each case is a fresh interpreter (``python -X importtime`` shows what pulls what); the
baseline is ``python -c pass`` measured in the same run, best of N, so the ratio holds on a
loaded machine where the absolute numbers do not. Targets (issue #40): ``import tinyctx``
<= 0.1 s, and the command's cold start (``tinyctx --help``) <= 0.35 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, print_table

COMMAND = Path(sys.executable).with_name("tinyctx")


def _cold(argv: list[str], repeat: int) -> float:
    """Best wall time of ``repeat`` fresh processes running ``argv``."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def _python(code: str, repeat: int) -> float:
    return _cold([sys.executable, "-c", code], repeat)


def run(quick: bool = False) -> list[Row]:
    repeat = 5 if quick else 15
    bare = _python("pass", repeat)
    rows = []
    cases = [
        ("import tinyctx", "import tinyctx", 0.1),
        ("from tinyctx import Agent, Session", "from tinyctx import Agent, Session, tool", None),
        ("import tinyctx.middleware", "import tinyctx.middleware", None),
    ]
    for case, code, limit in cases:
        seconds = _python(code, repeat)
        rows.append(
            Row(
                "import",
                case,
                seconds,
                baseline="python -c pass",
                baseline_seconds=bare,
                target=f"<= {limit} s" if limit else None,
                met=seconds <= limit if limit else None,
            )
        )
    command = [str(COMMAND)] if COMMAND.exists() else [sys.executable, "-m", "tinyctx.cli"]
    seconds = _cold([*command, "--help"], repeat)
    rows.append(
        Row(
            "import",
            "tinyctx --help (cold start)",
            seconds,
            baseline="python -c pass",
            baseline_seconds=bare,
            target="<= 0.35 s",
            met=seconds <= 0.35,
        )
    )
    return rows


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))
