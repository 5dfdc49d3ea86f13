"""Real transcripts for tests and benchmarks: OpenAI chat-completions messages as tinyctx
messages.

``load_openai_jsonl(path)`` reads one JSON object per line (``role``, ``content``,
``tool_calls`` with JSON-string ``arguments``, ``tool_call_id``); content is a string or
a list of parts. Arguments that are not a JSON object are kept verbatim in
``ToolCall.invalid_arguments``, as a provider adapter would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..formats.openai import parse_openai_message
from ..messages import Message

__all__ = ["messages_from_openai", "load_openai_jsonl"]


def messages_from_openai(records: Iterable[Mapping[str, Any]]) -> tuple[Message, ...]:
    """OpenAI chat messages (dicts) as tinyctx messages, in order: text or content parts
    (text, images, files), as :func:`tinyctx.formats.openai.from_openai` reads them, but
    nothing kept beyond what a tinyctx message holds and no pairing check (a real transcript
    may end with a call waiting for its result). A tool result without ``name`` gets ""."""
    return tuple(parse_openai_message(raw, index) for index, raw in enumerate(records))


def load_openai_jsonl(path: str | os.PathLike[str]) -> tuple[Message, ...]:
    """A JSONL file of OpenAI chat messages (one per line) as tinyctx messages."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return messages_from_openai(json.loads(line) for line in lines if line.strip())
