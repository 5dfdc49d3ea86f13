"""Lossless conversion between tinyctx messages and the formats agents speak and store.

- OpenAI chat completions: :func:`to_openai` / :func:`from_openai`
- Anthropic Messages API: :func:`to_anthropic` / :func:`from_anthropic`
- SWE-agent ``.traj``: :func:`to_swe_agent` / :func:`from_swe_agent`
- mini-swe-agent ``.traj.json``: :func:`to_mini_swe_agent` / :func:`from_mini_swe_agent`
- Claude Code session logs (read only): :func:`from_claude_code`
- OpenHands evaluation ``output.jsonl`` and tau-bench results (read only):
  :func:`from_openhands`, :func:`from_tau_bench`
- Agent TARS run logs, session dumps and event streams (read only): :func:`from_agent_tars`
- files: :func:`load_transcript` / :func:`read_transcript` (format detected),
  :func:`write_transcript`

Content parts (images, documents) are read and written in each format's own shape
(OpenAI ``image_url``/``file`` parts, Anthropic ``image``/``document`` blocks).

``from_x(to_x(m)) == m`` for every history a format can express, ``essential`` and
``metadata`` included (carried in a ``"tinyctx"`` key where the format has no field). What a
format cannot express, and malformed input (bad JSON, an unknown role, a tool result
without a call), raise :class:`FormatError` (a ``ValueError``) naming the message index and,
for files, the line. Fields of a read file that tinyctx does not model are kept in
``metadata[<format>]`` and written back. ``for_api=True`` (used by the provider adapters)
writes what a provider accepts and leaves local bookkeeping out.
"""

from __future__ import annotations

from ._common import EXTENSION_KEY, FormatError
from .agent_logs import from_openhands, from_tau_bench
from .agent_tars import from_agent_tars
from .anthropic import from_anthropic, to_anthropic
from .claude_code import from_claude_code
from .files import (
    FORMATS,
    Transcript,
    TranscriptFormat,
    detect_format,
    format_transcript,
    load_transcript,
    parse_transcript,
    read_transcript,
    write_transcript,
)
from .openai import from_openai, to_openai
from .swe_agent import from_mini_swe_agent, from_swe_agent, to_mini_swe_agent, to_swe_agent

__all__ = [
    "EXTENSION_KEY",
    "FormatError",
    "FORMATS",
    "Transcript",
    "TranscriptFormat",
    "to_openai",
    "from_openai",
    "to_anthropic",
    "from_anthropic",
    "to_swe_agent",
    "from_swe_agent",
    "to_mini_swe_agent",
    "from_mini_swe_agent",
    "from_claude_code",
    "from_openhands",
    "from_tau_bench",
    "from_agent_tars",
    "detect_format",
    "parse_transcript",
    "read_transcript",
    "load_transcript",
    "format_transcript",
    "write_transcript",
]
