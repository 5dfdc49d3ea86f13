"""Docstring parsing: the main text and per-parameter descriptions.

Google (``Args:``), NumPy (``Parameters`` + dashes) and Sphinx (``:param x:``) styles. The
main text is everything before the first section; ``Args``-like and ``Attributes``
sections give parameter descriptions; other sections (``Returns``, ``Raises``, ...) are
dropped from the description a model sees.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

import attrs

__all__ = ["Docstring", "parse_docstring"]


@attrs.frozen
class Docstring:
    """A docstring's main text and its per-parameter descriptions."""

    description: str = ""
    params: Mapping[str, str] = attrs.field(factory=dict)


_PARAM_SECTIONS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "keyword args",
    "keyword arguments",
    "other parameters",
    "attributes",
}
_OTHER_SECTIONS = {
    "returns",
    "return",
    "raises",
    "yields",
    "yield",
    "examples",
    "example",
    "notes",
    "note",
    "see also",
    "warnings",
    "warning",
    "references",
    "todo",
    "methods",
}
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(
    r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?(\w+):\s*(.*)$"
)
_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _header(lines: list[str], i: int) -> tuple[str, bool] | None:
    """``(section, numpy_style)`` when line ``i`` starts a section."""
    line = lines[i]
    if _indent(line) or not line.strip():
        return None
    text = line.strip()
    if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]):
        name = text.lower()
        if name in _PARAM_SECTIONS or name in _OTHER_SECTIONS:
            return name, True
    if text.endswith(":"):
        name = text[:-1].strip().lower()
        if name in _PARAM_SECTIONS or name in _OTHER_SECTIONS:
            return name, False
    if text.startswith(":") and re.match(r"^:\w+", text):
        return "sphinx", False
    return None


def parse_docstring(doc: str | None) -> Docstring:
    """Split a docstring into its main text and its parameter descriptions."""
    if not doc:
        return Docstring()
    lines = inspect.cleandoc(doc).splitlines()
    start = next((i for i in range(len(lines)) if _header(lines, i)), len(lines))
    description = "\n".join(lines[:start]).strip()
    params: dict[str, str] = {}
    i = start
    while i < len(lines):
        found = _header(lines, i)
        if found is None:
            i += 1
            continue
        name, numpy = found
        if name == "sphinx":
            i = _sphinx_entries(lines, i, params)
            continue
        i += 2 if numpy else 1
        body: list[str] = []
        while i < len(lines) and not _header(lines, i):
            if not numpy and lines[i].strip() and not _indent(lines[i]):
                break
            body.append(lines[i])
            i += 1
        if name in _PARAM_SECTIONS:
            _section_entries(body, numpy, params)
    return Docstring(description, params)


def _section_entries(body: list[str], numpy: bool, params: dict[str, str]) -> None:
    content = [line for line in body if line.strip()]
    if not content:
        return
    base = min(_indent(line) for line in content)
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in content:
        if _indent(line) == base:
            match = (_NUMPY_ENTRY if numpy else _GOOGLE_ENTRY).match(line.strip())
            if match is None:
                current = None
                continue
            current = entries.setdefault(match.group(1), [])
            if not numpy and match.group(2):
                current.append(match.group(2))
        elif current is not None:
            current.append(line.strip())
    for key, parts in entries.items():
        params[key] = " ".join(parts).strip()


def _sphinx_entries(lines: list[str], i: int, params: dict[str, str]) -> int:
    while i < len(lines):
        text = lines[i].strip()
        match = _SPHINX_PARAM.match(text)
        if match is None and text.startswith(":"):
            i += 1  # :returns:, :type x:, :raises ...: not a parameter description
            while i < len(lines) and _indent(lines[i]) and lines[i].strip():
                i += 1
            continue
        if match is None:
            return i
        parts = [match.group(2)]
        i += 1
        while i < len(lines) and _indent(lines[i]) and lines[i].strip():
            parts.append(lines[i].strip())
            i += 1
        params[match.group(1)] = " ".join(p for p in parts if p).strip()
    return i
