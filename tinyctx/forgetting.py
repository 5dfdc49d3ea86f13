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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    "FATES",
    "Blame",
    "LossBlame",
    "use_json",
    "breakdown",
    "blame_breakdown",
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
    blame: tuple[Blame, ...] = ()
    """Per lost use (in the order of ``lost``), what removed its span (:class:`LossBlame`);
    empty when nobody attributed the losses."""

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


# ---------------------------------------------------------------------------------------
# which layer removed a lost span

FATES = ("cut on arrival", "cut", "cleared", "rewritten", "summarized", "trimmed", "removed")
"""What became of a lost use's source message (:class:`LossBlame`): cut as it entered the
history, cut later, cleared to a placeholder, otherwise rewritten, or gone from the request
into a summary, by a trim, or else removed."""

_FATE_ROLES = {"cut": "shrink", "cleared": "compact", "summarized": "summarize", "trimmed": "trim"}


@frozen
class Blame:
    """What removed a lost use's span: ``fate`` (one of :data:`FATES`), the layers or
    policies ``by`` (``+``-joined; ``"?"`` when none reported acting) and the model ``call``
    (from 1) before which it happened."""

    fate: str
    by: str
    call: int

    @property
    def key(self) -> str:
        return f"{self.by}: {self.fate}"


@frozen
class _State:
    call: int
    fate: str
    by: str
    message: Message = field(repr=False)
    text: str = field(repr=False)


def _marks(message: Message) -> Mapping[str, Any]:
    value = message.metadata.get("tinyctx")
    return value if isinstance(value, Mapping) else {}


class LossBlame:
    """Follows, call by call of a replay, each tool result and user message of the sent
    requests, so that a lost use can be blamed on what removed its span: the first state of
    its source message (the latest recorded one that held the span) that no longer holds
    it, or the call where that message left the request (:meth:`blame`).

    A state's ``by`` is the layer or policy whose role fits the fate (``roles``: a name's
    role, as a guard's policy order names them) among those that acted before that call,
    else the one whose event named the tool result, else all that acted. When one relief
    cuts a result and then summarizes it, the fate is the last one the replay saw (the
    request shows only the end of the relief)."""

    def __init__(self, transcript: Sequence[Message], roles: Mapping[str, str]) -> None:
        self.transcript = tuple(transcript)
        self.roles = dict(roles)
        self._results: dict[str, list[_State]] = {}
        self._users: dict[str, Blame | None] = {}  # a user text: None while it is there
        self._gone: dict[str, Blame] = {}
        self._summaries: set[int] = set()

    @classmethod
    def for_stack(cls, transcript: Sequence[Message], stack: Iterable[object]) -> LossBlame:
        """A blame whose roles are those of ``stack``'s layers and guard policies (their
        ``role`` attributes, by ``name``)."""
        roles: dict[str, str] = {}
        for layer in stack:
            for item in (layer, *getattr(layer, "policies", ())):
                role, name = getattr(item, "role", None), getattr(item, "name", None)
                if isinstance(role, str) and isinstance(name, str):
                    roles[name] = role
        return cls(transcript, roles)

    def _by(self, fate: str, acting: Sequence[str], named: str | None) -> str:
        role = _FATE_ROLES.get(fate)
        fitting = [n for n in dict.fromkeys(acting) if role and self.roles.get(n) == role]
        if fitting:
            return "+".join(fitting)
        return named or "+".join(dict.fromkeys(acting)) or "?"

    def observe(
        self,
        call: int,
        messages: Sequence[Message],
        acting: Sequence[str] = (),
        touched: Mapping[str, str] | None = None,
    ) -> None:
        """Take model call ``call``'s sent ``messages``; ``acting`` names the layers and
        policies that acted since the call before, ``touched`` the one whose event named a
        tool result (by its call id)."""
        touched = touched or {}
        summaries = {id(m) for m in messages if "summary" in _marks(m)}
        new_summary = bool(summaries - self._summaries)
        self._summaries = summaries
        present: set[str] = set()
        texts: set[str] = set()
        for message in messages:
            if isinstance(message, ToolResult):
                present.add(message.tool_call_id)
                self._result(call, message, acting, touched.get(message.tool_call_id))
            elif isinstance(message, UserMessage):
                texts.add(message.text)
        gone = "summarized" if new_summary else "removed"
        if not new_summary and any(self.roles.get(n) == "trim" for n in acting):
            gone = "trimmed"
        for call_id in self._results:
            if call_id not in present and call_id not in self._gone:
                self._gone[call_id] = Blame(gone, self._by(gone, acting, None), call)
            elif call_id in present:
                self._gone.pop(call_id, None)
        for text, blame in list(self._users.items()):
            if text not in texts and blame is None:
                self._users[text] = Blame(gone, self._by(gone, acting, None), call)
            elif text in texts:
                self._users[text] = None
        for text in texts:
            self._users.setdefault(text, None)

    def _result(
        self, call: int, message: ToolResult, acting: Sequence[str], named: str | None
    ) -> None:
        states = self._results.get(message.tool_call_id)
        if states and states[-1].message is message:
            return
        text = searchable_text(message)
        if states and states[-1].text == text:
            return
        marks = _marks(message)
        if "cleared" in marks:
            fate = "cleared"
        elif "truncated" in marks:
            fate = "cut" if states else "cut on arrival"
        else:
            fate = "rewritten"
        by = named if fate == "cut on arrival" and named else self._by(fate, acting, named)
        self._results.setdefault(message.tool_call_id, []).append(
            _State(call, fate, by, message, text)
        )

    def blame(self, use: Use) -> Blame:
        """What removed ``use``'s span from the requests the replay sent."""
        source = self.transcript[use.source]
        span = use.span.text
        if isinstance(source, ToolResult):
            for state in self._results.get(source.tool_call_id, ()):
                if span not in state.text:
                    return Blame(state.fate, state.by, state.call)
            gone = self._gone.get(source.tool_call_id)
        else:
            gone = self._users.get(source.text)
        return gone or Blame("removed", "?", use.call)


_SPAN_SHOWN = 80
"""Characters of a lost span the JSON shows (the rest is cut, with an ellipsis)."""


def use_json(use: Use, blame: Blame | None = None) -> dict[str, Any]:
    """A lost use as a replay's JSON shows it (with what removed it, when known)."""
    text = use.span.text
    shown = text if len(text) <= _SPAN_SHOWN else text[: _SPAN_SHOWN - 1] + "\u2026"
    out: dict[str, Any] = {
        "kind": use.span.kind,
        "span": shown,
        "source": use.source,
        "tool": use.source_name,
    }
    if blame is not None:
        out.update(fate=blame.fate, by=blame.by, removed_before_call=blame.call)
    return out


def breakdown(
    calls: Iterable[CallForgetting], key: Callable[[Use], str]
) -> dict[str, dict[str, int]]:
    """Uses and lost uses by ``key`` (a span's kind, or the tool its source came from),
    the most used first."""
    counts: dict[str, dict[str, int]] = {}
    for call in calls:
        for use in call.uses:
            counts.setdefault(key(use), {"uses": 0, "lost": 0})["uses"] += 1
        for use in call.lost:
            counts[key(use)]["lost"] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1]["uses"], item[0])))


def blame_breakdown(calls: Iterable[CallForgetting]) -> dict[str, int]:
    """Lost uses by what removed them (``"by: fate"``, :class:`Blame`), the most first."""
    counts: dict[str, int] = {}
    for call in calls:
        for blame in call.blame:
            counts[blame.key] = counts.get(blame.key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
