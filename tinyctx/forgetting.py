"""What compaction forgot: the lost-references measure.

A recorded transcript holds the real model's outputs. At model call *t*, the recorded reply
(its text and the values of its tool-call arguments) **uses** earlier context when it holds
a distinctive *span* that occurs word for word (as a substring) in an earlier tool result or
user message of the uncompacted recording, and in no system message before it. A use is
**lost** when the request a stack actually sent at call *t* no longer contains the span
anywhere (in the text of any message, or the values of any earlier tool call's arguments).
The lost rate is lost uses over all uses.

Uses come from the recording alone (:class:`UsesIndex`), so every stack is scored on the
same uses; a replay without a stack loses none, and clearing every tool result gives the
bound of what clearing tool output can lose (:meth:`UsesIndex.tool_result_bound`).

The span rules (:func:`find_spans`), applied to the reply's text and to every string value of
its tool-call arguments; each distinct span counts once per call, whatever rules found it:

``path``
    A file path: two or more segments of letters, digits and ``._+@-`` joined by ``/``
    (optionally led by ``/``, ``./``, ``../`` or ``~/``), or a bare file name ending in a
    common source or data extension (``.py``, ``.json``, ``.md``, ... :data:`EXTENSIONS`);
    at least 4 characters with a letter in them.
``identifier``
    A code identifier of 8 or more characters (``[A-Za-z_][A-Za-z0-9_]*``) that is not
    shaped like a plain English word: it holds an underscore, a digit, or a lower-case
    letter followed by an upper-case one (``snake_case``, ``camelCase``, ``PascalCase``,
    ``base64``). ``function``, ``Important`` or ``IMPORTANT`` are words, not identifiers.
``number``
    A run of 4 or more digits not inside a longer word.
``hex``
    ``0x`` and 4+ hex digits, or 7+ lower-case hex digits holding both a digit and a letter
    (commit hashes, ids).
``quoted``
    The text between a pair of ``"``, ``'`` or backticks on one line: 4 to 200 characters
    (backticks: 3 to 200), not only spaces.
``line``
    A whole line, stripped of surrounding white space, of 16 or more characters (an edit's
    ``old_string``, a copied command or error line).

The measure is deterministic: the same transcript and the same sent requests give the same
uses and losses, on every machine (no dictionary, no tokenizer).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from .messages import AssistantMessage, Message, SystemMessage, ToolResult, UserMessage

__all__ = [
    "EXTENSIONS",
    "SPAN_KINDS",
    "Span",
    "Use",
    "CallForgetting",
    "UsesIndex",
    "find_spans",
    "reply_spans",
    "searchable_text",
    "request_text",
    "lost_uses",
]

SPAN_KINDS = ("path", "identifier", "number", "hex", "quoted", "line")
"""The span rules, in the order :func:`find_spans` applies them."""

# fmt: off
EXTENSIONS = (
    "py", "pyi", "pyx", "ipynb", "js", "mjs", "cjs", "ts", "tsx", "jsx", "json", "jsonl",
    "toml", "yaml", "yml", "md", "rst", "txt", "cfg", "ini", "conf", "c", "h", "cc", "cpp",
    "hpp", "rs", "go", "java", "kt", "rb", "php", "sh", "bash", "zsh", "sql", "html", "css",
    "scss", "lock", "xml", "csv", "tsv", "log", "swift", "scala", "lua", "r", "pl", "vue",
    "svelte", "proto", "gradle",
)
"""The extensions that make a bare file name (no ``/``) a ``path`` span."""
# fmt: on

_SEGMENT = r"[\w.+@-]+"
_PATH = re.compile(rf"(?<![\w./~-])(?:~/|\.\.?/|/)?{_SEGMENT}(?:/{_SEGMENT})+/?")
_FILE = re.compile(rf"(?<![\w/.-])[\w-]+\.(?:{'|'.join(EXTENSIONS)})(?![\w-])")
_IDENTIFIER = re.compile(r"(?<![\w])[A-Za-z_][A-Za-z0-9_]{7,}(?![\w])")
_CAMEL = re.compile(r"[a-z][A-Z]")
_NUMBER = re.compile(r"(?<![\w])\d{4,}(?![\w])")
_HEX = re.compile(r"(?<![\w])(?:0x[0-9a-fA-F]{4,}|[0-9a-f]{7,})(?![\w])")
_QUOTED = re.compile(r'"([^"\n]{4,200})"|\'([^\'\n]{4,200})\'|`([^`\n]{3,200})`')
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"\d")
_HEX_LETTER = re.compile(r"[a-f]")
MIN_LINE = 16
"""A stripped line shorter than this is no ``line`` span."""


@frozen
class Span:
    """A distinctive piece of a reply: its text and the rule that found it."""

    text: str
    kind: str


def _is_identifier(word: str) -> bool:
    return "_" in word or _DIGIT.search(word) is not None or _CAMEL.search(word) is not None


def _hex(word: str) -> bool:
    if word.startswith("0x"):
        return True
    return _DIGIT.search(word) is not None and _HEX_LETTER.search(word) is not None


def find_spans(text: str) -> Iterator[Span]:
    """Every span of ``text`` by the rules of this module, rule by rule, in text order
    (a span may come more than once, and under more than one rule)."""
    for match in _PATH.finditer(text):
        found = match.group()
        if len(found) >= 4 and _LETTER.search(found):
            yield Span(found, "path")
    for match in _FILE.finditer(text):
        yield Span(match.group(), "path")
    for match in _IDENTIFIER.finditer(text):
        if _is_identifier(match.group()):
            yield Span(match.group(), "identifier")
    for match in _NUMBER.finditer(text):
        yield Span(match.group(), "number")
    for match in _HEX.finditer(text):
        if _hex(match.group()):
            yield Span(match.group(), "hex")
    for match in _QUOTED.finditer(text):
        inner = next(g for g in match.groups() if g is not None)
        if inner.strip():
            yield Span(inner, "quoted")
    for line in text.splitlines():
        stripped = line.strip()
        if len(stripped) >= MIN_LINE:
            yield Span(stripped, "line")


def _argument_strings(value: Any) -> Iterator[str]:
    """Every string (and number, as text) among a tool call's argument values."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _argument_strings(item)
    elif isinstance(value, Sequence):
        for item in value:
            yield from _argument_strings(item)


def _reply_texts(message: AssistantMessage) -> Iterator[str]:
    if message.text:
        yield message.text
    for call in message.tool_calls:
        yield from _argument_strings(call.arguments)


def reply_spans(message: AssistantMessage) -> tuple[Span, ...]:
    """The distinct spans of a reply (its text, then its tool-call argument values), each
    once, under the first rule that found it."""
    seen: dict[str, Span] = {}
    for text in _reply_texts(message):
        for span in find_spans(text):
            seen.setdefault(span.text, span)
    return tuple(seen.values())


def searchable_text(message: Message) -> str:
    """What of ``message`` a span is looked for in: its text, and for a model turn the
    string values of its tool calls' arguments (NUL-separated, so no span straddles two)."""
    if isinstance(message, AssistantMessage) and message.tool_calls:
        return "\x00".join(_reply_texts(message))
    return message.text


def request_text(messages: Iterable[Message], cache: dict[int, tuple[Message, str]]) -> str:
    """The searchable text of every message of a request, NUL-separated. ``cache`` keeps
    each message's text by identity across the calls of one replay."""
    parts: list[str] = []
    for message in messages:
        known = cache.get(id(message))
        if known is None or known[0] is not message:
            known = (message, searchable_text(message))
            cache[id(message)] = known
        parts.append(known[1])
    return "\x00".join(parts)


@frozen
class Use:
    """One use of earlier context: model call ``call`` (the recording's ``call``-th model
    turn, from 1) holds ``span``, last seen before it in recorded message ``source``."""

    call: int
    span: Span
    source: int
    """Index in the recording of the latest tool result or user message holding the span."""
    source_name: str
    """The tool whose result that is, or ``"user"``."""


@frozen
class CallForgetting:
    """The uses of one model call and those of them the sent request had lost."""

    uses: tuple[Use, ...] = ()
    lost: tuple[Use, ...] = ()

    @property
    def lost_rate(self) -> float | None:
        return len(self.lost) / len(self.uses) if self.uses else None


def lost_uses(uses: Sequence[Use], messages: Iterable[Message]) -> tuple[Use, ...]:
    """The ``uses`` whose span no message of ``messages`` (a sent request) contains."""
    if not uses:
        return ()
    text = request_text(messages, {})
    return tuple(u for u in uses if u.span.text not in text)


@frozen
class UsesIndex:
    """Every use of a recording, by model call: built once (:meth:`build`), shared by
    every replay of that recording."""

    transcript: tuple[Message, ...] = field(repr=False)
    calls: tuple[int, ...]
    """The index in the recording of each model turn, in order."""
    uses: tuple[tuple[Use, ...], ...]
    """The uses of each model turn (``uses[i]`` is call ``i + 1``'s)."""

    @classmethod
    def build(cls, transcript: Sequence[Message]) -> UsesIndex:
        """Index ``transcript``: each model turn's spans found, as a substring, in the
        tool results and user messages before it and in no system message before it."""
        transcript = tuple(transcript)
        sources: list[str] = []  # the text of each tool result / user message, in order
        starts: list[int] = []  # where each begins in the joined text
        owners: list[int] = []  # its index in the recording
        system: list[str] = []
        calls: list[int] = []
        uses: list[tuple[Use, ...]] = []
        joined, size = "", 0
        for index, message in enumerate(transcript):
            if isinstance(message, ToolResult | UserMessage):
                text = message.text
                starts.append(size)
                owners.append(index)
                sources.append(text)
                size += len(text) + 1
                joined = ""  # rebuilt lazily at the next model turn
            elif isinstance(message, SystemMessage):
                system.append(message.text)
            elif isinstance(message, AssistantMessage):
                if not joined and sources:
                    joined = "\x00".join(sources)
                calls.append(index)
                number = len(calls)
                found: list[Use] = []
                for span in reply_spans(message):
                    at = joined.rfind(span.text)
                    if at < 0 or any(span.text in s for s in system):
                        continue
                    owner = owners[bisect.bisect_right(starts, at) - 1]
                    found.append(Use(number, span, owner, _source_name(transcript, owner)))
                uses.append(tuple(found))
        return cls(transcript, tuple(calls), tuple(uses))

    def at(self, recorded_index: int) -> tuple[Use, ...]:
        """The uses of the model turn at ``recorded_index`` of the recording (none when
        that is no model turn)."""
        position = bisect.bisect_left(self.calls, recorded_index)
        if position < len(self.calls) and self.calls[position] == recorded_index:
            return self.uses[position]
        return ()

    @property
    def total(self) -> int:
        return sum(len(u) for u in self.uses)

    def score(
        self, recorded_index: int, messages: Iterable[Message], cache: dict[int, Any] | None = None
    ) -> CallForgetting:
        """The uses of the turn at ``recorded_index`` and those ``messages`` (what was sent
        for it) lost. ``cache`` keeps message texts across the calls of one replay."""
        uses = self.at(recorded_index)
        if not uses:
            return CallForgetting()
        text = request_text(messages, {} if cache is None else cache)
        return CallForgetting(uses, tuple(u for u in uses if u.span.text not in text))

    def tool_result_bound(self) -> int:
        """Uses lost when every tool result is cleared and nothing else changes: the most
        any policy that only rewrites tool output can lose."""
        lost = 0
        kept: list[str] = []
        position = 0
        for call, index in enumerate(self.calls):
            while position < index:
                message = self.transcript[position]
                if not isinstance(message, ToolResult):
                    kept.append(searchable_text(message))
                position += 1
            text = "\x00".join(kept)
            lost += sum(1 for u in self.uses[call] if u.span.text not in text)
        return lost


def _source_name(transcript: Sequence[Message], index: int) -> str:
    message = transcript[index]
    if isinstance(message, ToolResult):
        return message.name or _call_name(transcript, index, message.tool_call_id)
    return "user"


def _call_name(transcript: Sequence[Message], index: int, call_id: str) -> str:
    for message in reversed(transcript[:index]):
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                if call.id == call_id:
                    return call.name
            break
    return "?"
