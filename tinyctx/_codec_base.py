"""What the codec's writer and readers share.

The schema version, the error, the JSON machinery built once, and error paths.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from .errors import TinyCtxError, a_type
from .frozen import (
    MAX_NESTING,
)

CODEC_VERSION: Final = 1
"""The schema version this tinyctx writes (and the newest it reads)."""

T = TypeVar("T")

_INT_BOUND: Final = 1 << 14_000
"""Integers inside (-bound, bound) have at most 4215 digits: no need to count them."""

_TOO_DEEP: Final = (
    f"nested deeper than {MAX_NESTING} levels of objects and arrays "
    "(the most a thread keeps: tinyctx.codec.MAX_NESTING)"
)


class CodecError(TinyCtxError, ValueError):
    """A value that cannot be encoded, or a document that cannot be decoded.

    ``path`` names where (``messages[12].tool_calls[0].arguments``; empty for the whole
    document) and ``problem`` what is wrong there.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path or '<document>'}: {problem}")


_ENCODER = json.JSONEncoder(
    ensure_ascii=True, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_DECODER = json.JSONDecoder()
_orjson_loads: Callable[[str], Any] | None
try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - a dependency; the stdlib parser reads the same
    _orjson_loads = None
_loads = _DECODER.decode
# the C encoder and scanner behind json.dumps/json.loads, built once: the per-call setup
# of JSONEncoder.encode costs as much as encoding a small message
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_scanner = getattr(json.scanner, "c_make_scanner", None)
_dumps: Callable[[dict[str, Any]], str] = _ENCODER.encode
_fast_loads: Callable[[str], Any] = _loads
if _c_encoder is not None and _c_scanner is not None:  # CPython: always
    _encode_chunks = _c_encoder(
        None, None, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, False
    )
    _scan = _c_scanner(_DECODER)

    def _c_dumps(obj: dict[str, Any]) -> str:
        return "".join(_encode_chunks(obj, 0))

    def _c_loads(doc: str) -> Any:
        try:
            value, end = _scan(doc, 0)
        except (StopIteration, ValueError):
            return _loads(doc)  # the full parser reports the error with its position
        return value if end == len(doc) else _loads(doc)

    _dumps = _c_dumps
    _fast_loads = _c_loads


# ---------------------------------------------------------------------------------------
# paths


class _Bad(Exception):
    """Internal: a problem found deep in a value; the path is built while unwinding."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.parts: list[str | int] = []


def _join(base: str, parts: Iterable[str | int]) -> str:
    path = base
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path = f"{path}.{part}" if path else part
        else:
            path += f"[{json.dumps(part)}]"
    return path


def _raise_bad(base: str, bad: _Bad) -> CodecError:
    parts = bad.parts[::-1]
    if len(parts) <= 24:
        return CodecError(_join(base, parts), bad.problem)
    # a path down a deeply nested value: its first and last steps, the count between
    elided = _join(base, parts[:12]) + f"[...{len(parts) - 16} more...]"
    return CodecError(elided + _join("_", parts[-4:])[1:], bad.problem)


# ---------------------------------------------------------------------------------------
# JSON values


def _kind(value: object) -> str:
    """The type of ``value`` with its article: "a dict", "an object"."""
    return a_type(type(value))
