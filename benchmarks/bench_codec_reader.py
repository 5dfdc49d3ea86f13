"""What the C reader costs over parsing alone, and what it saves over the Python build.

A 2,000-message thread (the bundled Claude Code session, repeated) is encoded once; then,
round by round (interleaved, so a load on the machine falls on every row alike):

- the C reader (``tinyctx._speedups``): ``orjson.loads`` parses each document, the
  messages are built in C from its result;
- ``orjson.loads`` alone on the same documents, building no message at all (the floor),
  and the stdlib's ``json.loads`` alone beside it (what orjson saves where no C reader
  is built);
- the pure-Python reader (``TINYCTX_NO_EXTENSIONS=1``, in a child process): ``orjson.loads``
  first, then the messages built in Python.

Ratios are against the C reader; the rows hold the medians of the rounds.

Verdict on the hand-written JSON scanner (issue #40): the C reader used to scan the JSON
text itself. Measured against "orjson first, then the C builder" in this script's rounds
(7 interleaved rounds, medians), the scanner took 48.0 ms per load and orjson + builder
30.4 ms (0.75x; orjson alone 27.7 ms): the scanner did not earn its ~440 lines and was
dropped. The builder is what remains.
"""

from __future__ import annotations

import json
import os
import statistics
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
    rounds = 2 if quick else 5
    docs = documents()
    if not C_READER:
        print("no C reader here (tinyctx._speedups not built): nothing to compare")
        return []
    c_reader: list[float] = []
    parse_only: list[float] = []
    stdlib: list[float] = []
    python: list[float] = []
    for _ in range(rounds):
        c_reader.append(best_of(lambda: decode_messages(docs), number=number, repeat=3))
        parse_only.append(best_of(lambda: [orjson.loads(d) for d in docs], number=number, repeat=3))
        stdlib.append(best_of(lambda: [json.loads(d) for d in docs], number=number, repeat=3))
        python.append(_python_reader(number))
    c_median, parse_median = statistics.median(c_reader), statistics.median(parse_only)
    base = "C reader"
    build_in_c = statistics.median([c - p for c, p in zip(c_reader, parse_only, strict=True)])
    return [
        Row("codec reader", f"C reader, {MESSAGES} msgs", c_median),
        Row(
            "codec reader",
            "orjson.loads alone (no objects)",
            parse_median,
            base,
            c_median,
            extra={"c_build_over_parse_s": build_in_c},
        ),
        Row(
            "codec reader",
            "stdlib json.loads alone",
            statistics.median(stdlib),
            "orjson.loads alone",
            parse_median,
        ),
        Row(
            "codec reader",
            "pure Python (orjson + Python build)",
            statistics.median(python),
            base,
            c_median,
        ),
    ]


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    if rows:
        build = rows[1].extra["c_build_over_parse_s"]
        speedup = rows[3].seconds / rows[0].seconds
        print(
            f"C build over orjson's parse: {build * 1e3:.2f} ms per {MESSAGES}-message load; "
            f"the C reader loads {speedup:.2f}x as fast as the pure-Python reader; orjson "
            f"parses {rows[2].ratio:.2f}x as fast as the stdlib"
        )
