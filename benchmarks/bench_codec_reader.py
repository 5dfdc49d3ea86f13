"""Does the C reader's own JSON scanner earn its weight? Three readers on the same bytes.

A 2,000-message thread (the bundled Claude Code session, repeated) is encoded once; then:

- the C reader (``tinyctx._speedups``): it scans the JSON text itself and builds the
  messages in C;
- the pure-Python reader (``TINYCTX_NO_EXTENSIONS=1``, measured in a child process):
  ``orjson.loads`` first, then the messages built in Python;
- ``orjson.loads`` alone on the same documents, building no message at all.

"orjson first, then build in C" cannot cost less than ``orjson.loads`` alone, so the C
reader beating that floor is what its scanner saves over the alternative the review
proposed (issue #40). Ratios are against the C reader, measured in the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, best_of, print_table

from tinyctx.codec import C_READER, decode_messages, encode_messages
from tinyctx.formats import load_transcript

MESSAGES = 2000
TRANSCRIPT = "marot__spotter__cc-main-4d5611e5.jsonl"


def documents() -> list[str]:
    """The stored documents of a ``MESSAGES``-message thread of real messages."""
    with resources.as_file(resources.files("tinyctx") / "data" / TRANSCRIPT) as path:
        session = load_transcript(path)
    history = (session * (MESSAGES // len(session) + 1))[:MESSAGES]
    return list(encode_messages(history))


def _python_reader(number: int) -> float:
    """Seconds per decode of the same documents by the pure-Python reader (a child process
    with the C reader turned off, as ``TINYCTX_NO_EXTENSIONS=1`` does for users)."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from _harness import best_of\n"
        "from bench_codec_reader import documents\n"
        "from tinyctx.codec import C_READER, decode_messages\n"
        "assert not C_READER\n"
        "docs = documents()\n"
        f"print(json.dumps(best_of(lambda: decode_messages(docs), number={number})))\n"
    )
    env = {**os.environ, "TINYCTX_NO_EXTENSIONS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(json.loads(done.stdout))


def run(quick: bool = False) -> list[Row]:
    number = 3 if quick else 10
    docs = documents()
    if not C_READER:
        print("no C reader here (tinyctx._speedups not built): nothing to compare")
        return []
    c_reader = best_of(lambda: decode_messages(docs), number=number)
    parse_only = best_of(lambda: [orjson.loads(d) for d in docs], number=number)
    python = _python_reader(number)
    base = "C reader (scans JSON itself)"
    return [
        Row("codec reader", f"C reader, {MESSAGES} msgs", c_reader),
        Row("codec reader", "orjson.loads alone (no objects)", parse_only, base, c_reader),
        Row(
            "codec reader",
            "pure Python (orjson + Python build)",
            python,
            base,
            c_reader,
            extra={"saved_vs_orjson_floor_s": parse_only - c_reader},
        ),
    ]


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    if rows:
        saved = rows[1].seconds - rows[0].seconds
        print(
            f"C reader vs the orjson-first floor: {saved * 1e3:+.2f} ms per {MESSAGES}-message "
            "load (positive: the scanner is faster than orjson's parse alone)"
        )
