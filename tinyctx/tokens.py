"""Token accounting: count messages, tool schemas and the system prompt.

:class:`TokenCounter` is the protocol every layer uses. Two counters are built in, both
memoized per message object (:class:`MemoCounter`), so re-checking a long, growing history
costs a lookup per old message and real work only for the new ones:

- :class:`HeuristicCounter`, the fast default: characters per token for ASCII, UTF-8 bytes
  per token for everything else (so CJK and emoji are not undercounted), plus a small
  per-message overhead. The constants were fitted against a real byte-level BPE tokenizer
  on real agent transcripts and CJK text (``benchmarks/bench_tokens_budget.py`` reports
  the error).
- :class:`TokenizersCounter`, exact for a given ``tokenizers`` vocabulary, encoding every
  uncached message of a history in one batch.

:class:`Calibration` turns the provider's reported ``input_tokens`` into better estimates,
and :func:`context_window` knows the windows of common model families.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from operator import call as _call
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from .errors import ConfigError
from .frozen import _SET_JSON_CHARS, FrozenDict
from .media_tokens import IMAGE_FORMULAS, ImageFormula, media_tokens
from .messages import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from .model import ModelRequest
from .parts import Content, content_text
from .tools import ToolSpec

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "TokenCounter",
    "MemoCounter",
    "HeuristicCounter",
    "TokenizersCounter",
    "default_counter",
    "message_payload",
    "arguments_text",
    "REASONING_TOKENS",
    "reasoning_tokens",
    "Calibration",
    "MODEL_WINDOWS",
    "context_window",
    "normalize_model_name",
    "window_table",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Estimates how many tokens a prompt costs."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int: ...

    def count_messages(self, messages: Sequence[Message]) -> int: ...

    def count_tools(self, tools: Sequence[ToolSpec]) -> int: ...

    def count_request(self, request: ModelRequest) -> int: ...


def _frozen_default(value: object) -> object:
    if isinstance(value, FrozenDict):
        return value.to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ARGUMENTS = json.JSONEncoder(ensure_ascii=False, default=_frozen_default)
try:  # the C encoder built once: json.dumps builds one (and a JSONEncoder) per call
    from _json import make_encoder as _make_encoder

    _ARGUMENTS_C: Any = _make_encoder(
        None, _frozen_default, json.encoder.encode_basestring, None, ": ", ", ", False, False, True
    )
except ImportError:  # pragma: no cover - CPython always has _json
    _ARGUMENTS_C = None
_orjson_dumps: Callable[[Any], bytes] | None
try:
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - a dependency; measured the slower way without it
    _orjson_dumps = None


def arguments_text(call: ToolCall) -> str:
    """A tool call's arguments as the model produced them: JSON (or the raw invalid text)."""
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    return _arguments_json(call.arguments)


def _arguments_json(arguments: FrozenDict[str, Any]) -> str:
    if not arguments:
        return "{}"
    if _ARGUMENTS_C is not None:
        # the FrozenDict's own dict: the C encoder takes it without a default() call
        return "".join(_ARGUMENTS_C(arguments._data, 0))
    return _ARGUMENTS.encode(arguments)  # pragma: no cover - CPython always has _json


def _json_chars(arguments: FrozenDict[str, Any]) -> int:
    """The length of ``arguments``' JSON text with four-space runs as 2 characters, or -1
    when it is not ASCII, measured (the caller found ``arguments._json_chars`` unset) and
    remembered on the deep-frozen mapping (it always encodes the same), so counting a call
    again, in any counter, skips the work."""
    chars = _flat_json_chars(arguments._data)
    if chars is None:  # nested values: measure the encoded text
        text = _arguments_json(arguments)
        chars = len(text) - 2 * text.count(_FOUR_SPACES) if text.isascii() else -1
    _SET_JSON_CHARS(arguments, chars)
    return chars


# bytes.translate(None, delete) tables: what JSON does NOT escape in a string (so deleting it
# leaves the escaped characters), and the escaped ones written in two characters (\" \\ \b
# \f \n \r \t; the other control characters take six, \u00XX)
_NOT_JSON_ESCAPED = bytes(b for b in range(0x20, 256) if b not in b'"\\')
_SHORT_ESCAPES = b'"\\\b\f\n\r\t'


_SAME_IN_ORJSON: Final = frozenset((str, int, bool, type(None)))
"""Values orjson writes as the stdlib encoder does (floats it may write shorter: 1e-07)."""


def _flat_json_chars(data: Mapping[str, Any]) -> int | None:
    """What :func:`_json_chars` measures, for an object of strings, integers, finite floats,
    booleans and nulls, without the stdlib encoder: orjson's compact text plus the spaces it
    leaves out, or (with a float, which orjson may write shorter) the lengths of the keys
    and values plus what their escapes add; -1 when a string is not ASCII, None when a value
    is nested (the caller encodes it)."""
    if not data:
        return 2
    if _orjson_dumps is not None and (
        # most calls pass one argument: its type alone, without a set of them
        type(*data.values()) in _SAME_IN_ORJSON
        if len(data) == 1
        else _SAME_IN_ORJSON.issuperset(map(type, data.values()))
    ):
        # orjson writes the same text minus the spaces after ',' and ':' (which never
        # touch a run of spaces) in one C call: cheaper than a pass per string here
        try:
            text = _orjson_dumps(data)
        except TypeError:  # a key that is not a string, an integer past 64 bits
            pass
        else:
            if not text.isascii():
                return -1
            return len(text) + 2 * len(data) - 1 - 2 * text.count(b"    ")
    chars = 6 * len(data)  # the braces, the ", " between items, the quotes and ": " of each key
    four, keep, short = _FOUR_SPACES, _NOT_JSON_ESCAPED, _SHORT_ESCAPES
    for key, value in data.items():
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return -1
            escaped = value.encode().translate(None, keep)
            chars += len(value) + 2 - 2 * value.count(four)
            if escaped:
                chars += len(escaped) + 4 * len(escaped.translate(None, short))
        elif kind is bool:
            chars += 4 if value else 5
        elif kind is int:
            chars += len(int.__repr__(value))
        elif value is None:
            chars += 4
        elif kind is float and math.isfinite(value):
            chars += len(float.__repr__(value))
        else:
            return None
        if not key.isascii():
            return -1
        chars += len(key)
        if not key.isidentifier():  # an identifier has nothing to escape and no spaces
            escaped = key.encode().translate(None, keep)
            chars -= 2 * key.count(four)
            if escaped:
                chars += len(escaped) + 4 * len(escaped.translate(None, short))
    return chars


REASONING_TOKENS: Final = "reasoning_tokens"
"""Key in ``metadata["tinyctx"]`` of an assistant message: tokens of opaque content the
provider keeps with it and reads again when the message is sent back (OpenAI Responses
reasoning items and compactions, Gemini thoughts). Every counter adds them to the
message's count."""


def reasoning_tokens(message: Message) -> int:
    """The reasoning tokens ``message`` carries for its provider (0 for none)."""
    own = message.metadata.get("tinyctx", None)
    if not isinstance(own, Mapping):
        return 0
    value = own.get(REASONING_TOKENS, 0)
    return value if type(value) is int and value > 0 else 0


def message_payload(message: Message) -> str:
    """The text of ``message`` a provider sends as tokens: content, tool calls (id, name,
    JSON arguments) and a tool result's call id. Role markers are the counter's overhead."""
    text = message.text
    if isinstance(message, AssistantMessage) and message.tool_calls:
        parts = [text] if text else []
        for call in message.tool_calls:
            parts.append(f"{call.id} {call.name} {arguments_text(call)}")
        return "\n".join(parts)
    if isinstance(message, ToolResult):
        return f"{message.tool_call_id}\n{text}" if text else message.tool_call_id
    return text


def _tool_payload(tool: ToolSpec) -> str:
    parameters = json.dumps(
        tool.parameters, ensure_ascii=False, separators=(",", ":"), default=_frozen_default
    )
    return f"{tool.name}\n{tool.description}\n{parameters}"


def _non_negative_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, value, "an integer >= 0", owner=owner)
    return value


class _KeyedRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that remembers the memo key of its message (set ``key`` after
    building it: with no Python ``__new__``/``__init__`` one costs a quarter as much)."""

    __slots__ = ("key",)
    key: int


class _Hot:
    """The history counted last, held strongly, with the counts of its messages from
    ``start`` on (``pending``) that are not yet remembered by weak reference."""

    __slots__ = ("messages", "pending", "start", "total")

    def __init__(
        self, messages: tuple[Message, ...], total: int, start: int, pending: list[int]
    ) -> None:
        self.messages = messages
        self.total = total
        self.start = start
        self.pending = pending


class MemoCounter:
    """The memoizing core both built-in counters share.

    Subclasses implement :meth:`count_text` (and may override :meth:`count_texts` to
    count many strings at once). Everything else is memoized here:

    - per history: the history counted last is held (strongly) with its total and its
      messages' counts, so re-counting it is an identity check and a history that only
      grew since costs a prefix comparison plus the new messages; a cold count builds
      nothing more (these counts and the per-message memo below hold at most ``max_memo``
      messages together: past it, they join the memo, which forgets its oldest);
    - per message, keyed by identity, once a message's count is needed outside that last
      history (another history is counted, or :meth:`count_message` asks): a weak
      reference forgets the count when the message is garbage collected (so an id is
      never reused for another message, and a shared counter keeps no old session's
      messages alive); at most ``max_memo`` messages, the oldest half forgotten when full;
    - per history prefix: the total of the last history that started with the same first
      message (the 64 most recent), by weak references: a history that grew while another
      one was counted in between still costs only its new messages, and a shared counter
      keeps no finished session's history alive once another history is counted;
    - per tool list (by identity) and per system prompt (by value).

    Images and documents in a message's content parts are counted by the ``images``
    formula ("anthropic", the default, or "openai"; see :mod:`tinyctx.media_tokens`) and
    memoized with the message.
    """

    message_overhead: int
    tool_call_overhead: int
    tool_overhead: int
    request_overhead: int

    def __init__(
        self,
        *,
        message_overhead: int = 4,
        tool_call_overhead: int = 4,
        tool_overhead: int = 8,
        request_overhead: int = 3,
        max_memo: int = 200_000,
        images: ImageFormula = "anthropic",
    ) -> None:
        owner = type(self).__name__
        if images not in IMAGE_FORMULAS:
            raise ConfigError("images", images, f"one of {IMAGE_FORMULAS}", owner=owner)
        self.images: ImageFormula = images
        self.message_overhead = _non_negative_int(owner, "message_overhead", message_overhead)
        self.tool_call_overhead = _non_negative_int(owner, "tool_call_overhead", tool_call_overhead)
        self.tool_overhead = _non_negative_int(owner, "tool_overhead", tool_overhead)
        self.request_overhead = _non_negative_int(owner, "request_overhead", request_overhead)
        if isinstance(max_memo, bool) or not isinstance(max_memo, int) or max_memo < 2:
            raise ConfigError("max_memo", max_memo, "an integer >= 2", owner=owner)
        self._max_memo = max_memo
        self._counts: dict[int, int] = {}
        self._alive: dict[int, _KeyedRef] = {}
        # first message's id -> weak refs to a counted history and its total
        self._prefix: dict[int, tuple[tuple[_KeyedRef, ...], int]] = {}
        self._hot: _Hot | None = None
        self._tools: dict[int, tuple[tuple[ToolSpec, ...], int]] = {}
        self._texts: dict[str, int] = {}

    # -- what a subclass provides --------------------------------------------------------

    def count_text(self, text: str) -> int:
        raise NotImplementedError

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        """Counts of many strings; a subclass may do them in one batch."""
        return [self.count_text(t) for t in texts]

    def _measure(self, messages: Sequence[Message]) -> list[int]:
        """Token counts of the messages' payloads (no overhead), as a new list."""
        return self.count_texts([message_payload(m) for m in messages])

    # -- messages ------------------------------------------------------------------------

    @property
    def memo_size(self) -> int:
        """How many messages' counts are remembered (by weak reference, or with the
        history counted last)."""
        memo, hot = self._counts, self._hot
        if hot is None or not hot.pending:
            return len(memo)
        return len(memo) + len({id(m) for m in hot.messages[hot.start :]} - memo.keys())

    def clear(self) -> None:
        """Forget every memoized count."""
        self._counts.clear()
        self._alive.clear()
        self._prefix.clear()
        self._hot = None
        self._tools.clear()
        self._texts.clear()

    def _remember(self, messages: Sequence[Message]) -> list[int]:
        """Measure ``messages`` (none of them memoized) in one :meth:`count_texts` call,
        remember them by weak reference, and return their counts."""
        counts = self._message_counts(messages)
        self._keep(messages, counts)
        return counts

    def _keep(self, messages: Sequence[Message], counts: Sequence[int]) -> None:
        """Remember ``counts`` of ``messages`` by weak reference (those not remembered yet),
        forgetting the oldest when the memo is full."""
        memo, alive, limit = self._counts, self._alive, self._max_memo
        if memo:
            new = [(m, c) for m, c in zip(messages, counts, strict=True) if id(m) not in alive]
            if not new:
                return
            messages, counts = [m for m, _ in new], [c for _, c in new]
        overflow = len(memo) + len(messages) - limit
        if overflow > 0:
            # forget the oldest (dicts keep insertion order), at least half of the memo so
            # eviction stays rare; prefix totals go too, their messages may be forgotten
            drop = min(len(memo), max(overflow, len(memo) // 2))
            for key in list(islice(memo, drop)):
                del memo[key]
                del alive[key]
            self._prefix.clear()
        start = max(0, len(messages) - limit)
        if start:
            messages, counts = messages[start:], counts[start:]
        forget = self._forget
        keys = list(map(id, messages))
        memo.update(zip(keys, counts, strict=True))
        for key, message in zip(keys, messages, strict=True):
            ref = alive[key] = _KeyedRef(message, forget)
            ref.key = key

    def _message_counts(self, messages: Sequence[Message]) -> list[int]:
        """Whole counts of ``messages``: payload, per-message and per-call overhead, media."""
        counts = self._measure(messages)
        base, per_call = self.message_overhead, self.tool_call_overhead
        counts = [c + base for c in counts]
        for index, message in enumerate(messages):
            if isinstance(message, AssistantMessage):
                calls = message.tool_calls
                if calls and per_call:
                    counts[index] += per_call * len(calls)
                if message.metadata:
                    counts[index] += reasoning_tokens(message)
            elif type(getattr(message, "content", "")) is not str:
                counts[index] += self.count_media(message.content)  # type: ignore[attr-defined]
        return counts

    def count_media(self, content: Content) -> int:
        """Tokens of the images and documents in ``content`` by the ``images`` formula
        (see :mod:`tinyctx.media_tokens`); a message's count includes them."""
        return media_tokens(content, self.count_text, self.images)

    def _forget(self, ref: _KeyedRef) -> None:
        """Weak-reference callback: the message is gone, so is its count."""
        if self._alive.get(ref.key) is ref:
            del self._alive[ref.key]
            self._counts.pop(ref.key, None)
            # a history whose first message is gone is never counted again
            self._prefix.pop(ref.key, None)

    def count_message(self, message: Message) -> int:
        count = self._counts.get(id(message))
        if count is None:
            hot = self._hot
            if hot is not None and hot.pending:  # it may be one of the last history's
                self._settle(hot)
                count = self._counts.get(id(message))
            if count is None:
                count = self._remember((message,))[0]
        return count

    def _settle(self, hot: _Hot) -> None:
        """Remember the last history's pending counts by weak reference."""
        self._keep(hot.messages[hot.start :], hot.pending)
        hot.start, hot.pending = len(hot.messages), []

    def _release(self, hot: _Hot) -> None:
        """Another history is counted: the last one is held no more, its counts and its
        total (as a prefix entry) are remembered by weak reference."""
        self._hot = None
        if hot.pending:
            self._settle(hot)
        messages = hot.messages
        refs = self._refs(messages)
        if refs is not None:
            prefix, key = self._prefix, id(messages[0])
            if key not in prefix and len(prefix) >= 64:
                del prefix[next(iter(prefix))]
            prefix[key] = (refs, hot.total)

    def _counts_of(self, messages: Sequence[Message]) -> list[int]:
        """The counts of ``messages``: remembered ones looked up, the others measured
        (all in one :meth:`count_texts` call) but not remembered."""
        memo = self._counts
        if not memo:
            return self._message_counts(messages)
        try:
            return list(map(memo.__getitem__, map(id, messages)))
        except KeyError:
            pass
        counts = list(map(memo.get, map(id, messages)))
        missing = [i for i, count in enumerate(counts) if count is None]
        measured = self._message_counts([messages[i] for i in missing])
        for i, count in zip(missing, measured, strict=True):
            counts[i] = count
        return counts  # type: ignore[return-value]  # no None is left

    def count_messages(self, messages: Sequence[Message]) -> int:
        if type(messages) is not tuple:
            messages = tuple(messages)
        if not messages:
            return 0
        hot = self._hot
        if hot is not None:
            held = hot.messages
            if held is messages:
                return hot.total
            k = len(held)
            if len(messages) >= k and messages[k - 1] is held[-1] and messages[:k] == held:
                # it only grew (equal messages have equal counts, so the total still holds)
                hot.messages = messages
                if len(messages) > k:
                    new = self._counts_of(messages[k:])
                    hot.total += sum(new)
                    hot.pending += new
                    self._bound(hot)
                return hot.total
            self._release(hot)
        hot = self._hot = self._count_history(messages)
        self._bound(hot)
        return hot.total

    def _bound(self, hot: _Hot) -> None:
        """Keep at most ``max_memo`` counts: past it, the last history's go to the memo
        (which forgets the oldest)."""
        if len(hot.pending) + len(self._counts) > self._max_memo:
            self._settle(hot)

    def _count_history(self, messages: tuple[Message, ...]) -> _Hot:
        entry = self._prefix.get(id(messages[0]))
        if entry is not None:
            refs, total = entry
            k = len(refs)
            if (
                len(messages) >= k
                and messages[k - 1] is refs[-1]()
                and tuple(map(_call, refs)) == messages[:k]
            ):
                # equal messages have equal counts, so the remembered total still holds
                new = self._counts_of(messages[k:])
                return _Hot(messages, total + sum(new), k, new)
        counts = self._counts_of(messages)
        return _Hot(messages, sum(counts), 0, counts)

    def _refs(self, messages: tuple[Message, ...]) -> tuple[_KeyedRef, ...] | None:
        """The memo's weak references to ``messages`` (None if one was evicted)."""
        alive = self._alive
        try:
            return tuple(map(alive.__getitem__, map(id, messages)))
        except KeyError:
            return None

    # -- tools, system prompt, request ---------------------------------------------------

    def count_tools(self, tools: Sequence[ToolSpec]) -> int:
        if not tools:
            return 0
        key = id(tools)
        entry = self._tools.get(key)
        if entry is not None and entry[0] is tools:
            return entry[1]
        counts = self.count_texts([_tool_payload(t) for t in tools])
        total = sum(counts) + self.tool_overhead * len(counts)
        if type(tools) is tuple:
            if len(self._tools) >= 64:
                del self._tools[next(iter(self._tools))]
            self._tools[key] = (tools, total)
        return total

    def _count_system(self, text: str | None) -> int:
        if not text:
            return 0
        count = self._texts.get(text)
        if count is None:
            count = self.count_text(text) + self.message_overhead
            if len(self._texts) >= 256:
                del self._texts[next(iter(self._texts))]
            self._texts[text] = count
        return count

    def count_request(self, request: ModelRequest) -> int:
        """Messages + tool schemas + system prompt + a small fixed overhead (reply priming)."""
        return (
            self.count_messages(request.messages)
            + self.count_tools(request.tools)
            + self._count_system(request.system_prompt)
            + self.request_overhead
        )


_FOUR_SPACES = "    "
_HANGUL = "\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f"
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u30ff"
# byte tables for bytes.translate(None, delete): what is NOT a lead byte of a non-ASCII
# character, of a character U+1100..U+11FF / U+3000..U+D7FF / U+F000..U+FFFF (where every
# counted CJK character lies), of an astral character
_NOT_LEADS = bytes(range(0xC0))
_NOT_CJK_LEADS = bytes(b for b in range(256) if b not in (0xE1, *range(0xE3, 0xEE), 0xEF))
_NOT_ASTRAL_LEADS = bytes(b for b in range(256) if not 0xF0 <= b <= 0xF4)
# the message types whose ``content`` is their text (a str, or parts to join)
_BUILT_IN = frozenset((UserMessage, AssistantMessage, ToolResult))
_CJK_CLASSES = (re.compile(f"[{_HAN}]"), re.compile(f"[{_KANA}]"), re.compile(f"[{_HANGUL}]"))


DEFAULT_SAMPLE_ABOVE: Final = 4096
"""``HeuristicCounter(sample_above=...)``: texts longer than this many characters are
measured on a sample."""

_SAMPLE_WINDOWS: Final = 8
_SAMPLE_WIDTH: Final = 256
_SAMPLE_CHARS: Final = _SAMPLE_WINDOWS * _SAMPLE_WIDTH


def _sample(text: str, n: int) -> str:
    """``_SAMPLE_WINDOWS`` windows of ``_SAMPLE_WIDTH`` characters spread evenly over
    ``text`` (``n`` characters, more than ``_SAMPLE_CHARS``), the first at its start and the
    last at its end, joined."""
    span = n - _SAMPLE_WIDTH
    last = _SAMPLE_WINDOWS - 1
    return "".join(
        [
            text[start : start + _SAMPLE_WIDTH]
            for start in (span * i // last for i in range(_SAMPLE_WINDOWS))
        ]
    )


class HeuristicCounter(MemoCounter):
    """Fast estimate: ASCII at ``chars_per_token``, CJK per character, the rest by UTF-8 bytes.

    ASCII text costs ``(chars - 2 * four_space_runs) / chars_per_token`` (indentation
    merges into few tokens). A Han character costs ``han_tokens`` (1.35), a kana
    ``kana_tokens`` (0.8) and a Hangul syllable or jamo ``hangul_tokens`` (1.75); any other
    non-ASCII text costs its UTF-8 bytes divided by ``nonascii_bytes_per_token``, plus
    ``astral_extra`` per character outside the BMP (emoji). Defaults were fitted on real
    transcripts (code and prose) and CJK text against a byte-level BPE vocabulary; they err
    on the side of overcounting. A text longer than ``sample_above`` characters (4096;
    None: never) is measured on 8 evenly spaced windows of 256 characters and scaled to its
    length: on the real transcripts that moves a count by at most 0.3%, and the sample is
    fixed, so a text always counts the same. ASCII strings take a fast path: two C-level
    passes and no allocation, inlined for whole messages, so a cold count of a long history
    costs about what LangChain's ``count_tokens_approximately`` does, which takes the
    strings' lengths and reads none of their text (``benchmarks/bench_tokens_budget.py``
    compares them). Other ``options`` (overheads, ``max_memo``) are :class:`MemoCounter`'s.
    """

    def __init__(
        self,
        *,
        chars_per_token: float = 3.1,
        nonascii_bytes_per_token: float = 2.3,
        astral_extra: float = 0.5,
        han_tokens: float = 1.35,
        kana_tokens: float = 0.8,
        hangul_tokens: float = 1.75,
        sample_above: int | None = DEFAULT_SAMPLE_ABOVE,
        **options: Any,
    ) -> None:
        for name, value, positive in (
            ("chars_per_token", chars_per_token, True),
            ("nonascii_bytes_per_token", nonascii_bytes_per_token, True),
            ("astral_extra", astral_extra, False),
            ("han_tokens", han_tokens, False),
            ("kana_tokens", kana_tokens, False),
            ("hangul_tokens", hangul_tokens, False),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
                or (positive and value == 0)
            ):
                allowed = "a finite number > 0" if positive else "a finite number >= 0"
                raise ConfigError(name, value, allowed, owner="HeuristicCounter")
        if sample_above is not None and (
            isinstance(sample_above, bool)
            or not isinstance(sample_above, int)
            or sample_above < _SAMPLE_CHARS
        ):
            raise ConfigError(
                "sample_above",
                sample_above,
                f"None or an integer number of characters >= {_SAMPLE_CHARS}",
                owner="HeuristicCounter",
            )
        super().__init__(**options)
        self.sample_above = sample_above
        self.chars_per_token = float(chars_per_token)
        self.nonascii_bytes_per_token = float(nonascii_bytes_per_token)
        self.astral_extra = float(astral_extra)
        self.han_tokens = float(han_tokens)
        self.kana_tokens = float(kana_tokens)
        self.hangul_tokens = float(hangul_tokens)

    def _message_counts(self, messages: Sequence[Message]) -> list[int]:
        if type(self).count_text is not HeuristicCounter.count_text:
            return super()._message_counts(messages)
        return self._measure(messages, whole=True)

    def _measure(self, messages: Sequence[Message], *, whole: bool = False) -> list[int]:
        # the payload's parts counted one by one (no joined copy of a large tool result),
        # with count_text's ASCII path inlined: this loop is a cold count's whole cost;
        # ``whole`` adds the overheads and media in the same pass (what _message_counts adds)
        if type(self).count_text is not HeuristicCounter.count_text:
            return self._measure_parts(messages)  # a subclass counts text its own way
        count = self.count_text
        per = self.chars_per_token
        ceil = math.ceil
        four = _FOUR_SPACES
        base = self.message_overhead if whole else 0
        per_call = self.tool_call_overhead if whole else 0
        exact_to = self.sample_above if self.sample_above is not None else math.inf
        counts: list[int] = []
        append = counts.append
        # an ASCII string costs ceil((len - 2 * four-space runs) / per): 0 for "", and at
        # least 1 for any other (each run leaves 2 of its 4 characters)
        for message in messages:
            kind: type[Message] | None = type(message)
            if kind in _BUILT_IN:
                text = message.content  # type: ignore[attr-defined]
                if type(text) is str:
                    tokens = base
                else:
                    tokens = base + self.count_media(text) if whole else base
                    text = content_text(text)
            else:  # any other type: its text as it defines it, its kind by what it extends
                text = message.text
                content = getattr(message, "content", "")
                tokens = (
                    base + self.count_media(content) if whole and type(content) is not str else base
                )
                kind = (
                    ToolResult
                    if isinstance(message, ToolResult)
                    else AssistantMessage
                    if isinstance(message, AssistantMessage)
                    else None
                )
            tokens += (
                ceil((len(text) - 2 * text.count(four)) / per)
                if text.isascii() and len(text) <= exact_to
                else count(text)
            )
            if kind is ToolResult:
                part = message.tool_call_id  # type: ignore[attr-defined]  # never empty
                if part.isascii():
                    tokens += ceil((len(part) - 2 * part.count(four)) / per)
                else:
                    tokens += count(part)
            elif kind is AssistantMessage:
                calls = message.tool_calls  # type: ignore[attr-defined]
                if calls:
                    tokens += per_call * len(calls)
                if message.metadata:
                    tokens += reasoning_tokens(message)
                for call in calls:
                    # id and name: short, never empty; the JSON arguments
                    part, name = call.id, call.name
                    if part.isascii() and name.isascii() and four not in part and four not in name:
                        tokens += ceil(len(part) / per) + ceil(len(name) / per)
                    else:
                        tokens += count(part) + count(name)
                    part = call.invalid_arguments
                    if part is None:  # JSON arguments: their ASCII size is remembered
                        chars = call.arguments._json_chars
                        if chars is None:
                            chars = _json_chars(call.arguments)
                        # JSON text is never empty: chars >= 2
                        tokens += ceil(chars / per) if chars >= 0 else count(arguments_text(call))
                    elif part.isascii():
                        tokens += ceil((len(part) - 2 * part.count(four)) / per)
                    else:
                        tokens += count(part)
            append(tokens)
        return counts

    def _measure_parts(self, messages: Sequence[Message]) -> list[int]:
        count = self.count_text
        counts: list[int] = []
        for message in messages:
            tokens = count(message.text)
            if isinstance(message, ToolResult):
                tokens += count(message.tool_call_id)
            elif isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    tokens += count(call.id) + count(call.name) + count(arguments_text(call))
            counts.append(tokens)
        return counts

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        n = len(text)
        limit = self.sample_above
        if limit is not None and n > limit:
            # a long text is measured on evenly spaced windows and scaled: what the
            # formula reads of it (indentation, the share of non-ASCII and CJK text) is
            # much the same along a long tool output, and reading all of it cost most of
            # a cold count
            sample = _sample(text, n)
            return max(1, math.ceil(self._estimate(sample) * n / len(sample)))
        return max(1, math.ceil(self._estimate(text)))

    def _estimate(self, text: str) -> float:
        """The formula's tokens for all of ``text``, not rounded."""
        n = len(text)
        if text.isascii():
            return (n - 2 * text.count(_FOUR_SPACES)) / self.chars_per_token
        # one UTF-8 encoding tells everything: each non-ASCII character has exactly one lead
        # byte (>= 0xC0), an astral one a 4-byte lead (0xF0-0xF4), and every CJK character
        # counted below a lead in _CJK_LEADS; the class scans run only when one is there
        data = text.encode("utf-8", "surrogatepass")
        leads = data.translate(None, _NOT_LEADS)
        ascii_chars = n - len(leads)
        # four ASCII spaces are the same four bytes in UTF-8, found faster in the bytes
        estimate = (ascii_chars - 2 * data.count(b"    ")) / self.chars_per_token
        bytes_left = len(data) - ascii_chars
        if leads.translate(None, _NOT_CJK_LEADS):
            han, kana, hangul = (len(pattern.findall(text)) for pattern in _CJK_CLASSES)
            bytes_left -= 3 * (han + kana + hangul)  # every one of them is 3 bytes in UTF-8
            estimate += (
                han * self.han_tokens + kana * self.kana_tokens + hangul * self.hangul_tokens
            )
        estimate += bytes_left / self.nonascii_bytes_per_token
        estimate += len(leads.translate(None, _NOT_ASTRAL_LEADS)) * self.astral_extra
        return estimate


class TokenizersCounter(MemoCounter):
    """Exact counts for one ``tokenizers`` vocabulary (plus the same per-message overhead).

    Every uncached message of a history is encoded in one ``encode_batch`` call. Build it
    from a :class:`tokenizers.Tokenizer`, a ``tokenizer.json`` file (:meth:`from_file`) or
    the Hugging Face hub (:meth:`from_pretrained`, needs the network). Padding and
    truncation configured on the tokenizer are switched off on a private copy, so a count
    is never capped or padded. ``options`` (overheads, ``max_memo``) are
    :class:`MemoCounter`'s.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        **options: Any,
    ) -> None:
        import tokenizers

        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise ConfigError(
                "tokenizer", tokenizer, "a tokenizers.Tokenizer", owner="TokenizersCounter"
            )
        if tokenizer.truncation is not None or tokenizer.padding is not None:
            tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())
            tokenizer.no_truncation()
            tokenizer.no_padding()
        super().__init__(**options)
        self.tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> TokenizersCounter:
        """Load a ``tokenizer.json`` file (offline)."""
        import tokenizers

        return cls(tokenizers.Tokenizer.from_file(os.fspath(path)), **options)

    @classmethod
    def from_pretrained(
        cls,
        identifier: str,
        *,
        revision: str = "main",
        token: str | None = None,
        **options: Any,
    ) -> TokenizersCounter:
        """Load the tokenizer of a Hugging Face hub model (needs the network)."""
        return cls(_load_pretrained(identifier, revision=revision, token=token), **options)

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        counts = [0] * len(texts)
        todo = [i for i, t in enumerate(texts) if t]
        if todo:
            encodings = self.tokenizer.encode_batch(
                [texts[i] for i in todo], add_special_tokens=False
            )
            for i, encoding in zip(todo, encodings, strict=True):
                counts[i] = len(encoding)
        return counts


def _load_pretrained(identifier: str, *, revision: str, token: str | None) -> tokenizers.Tokenizer:
    """The hub download behind :meth:`TokenizersCounter.from_pretrained` (tests replace it)."""
    import tokenizers

    return tokenizers.Tokenizer.from_pretrained(identifier, revision=revision, token=token)


_DEFAULT: HeuristicCounter | None = None


def default_counter() -> HeuristicCounter:
    """The shared heuristic counter layers use when none is configured."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = HeuristicCounter()
    return _DEFAULT


# ---------------------------------------------------------------------------------------
# calibration from reported usage


class Calibration:
    """Learns how a provider's reported ``input_tokens`` relate to a counter's estimate.

    The model is linear: ``reported ≈ ratio * estimate + hidden``. After each response,
    :meth:`observe` records the raw estimate of the request that was sent and the
    ``input_tokens`` the provider reported for it. :meth:`estimate` then answers
    ``last_reported + ratio * (raw - last_estimate)``: the last reported number plus the
    estimate of what was added (or removed) since, scaled by the learned ratio.

    The ratio is learned from the *differences* between consecutive observations, so a
    constant the counter cannot see (a provider-side system prompt, tool formatting)
    cancels out and stays in the anchor instead of inflating the ratio. It is the ratio of
    the summed differences (big changes weigh more than small ones), starting from a prior
    of 1.0 worth ``prior_tokens`` raw tokens; each sample is clamped to ``[min_ratio,
    max_ratio]`` before it counts, and so is the result, so no odd observation can blow it
    up. Differences smaller than ``min_delta`` raw tokens are too noisy and only move the
    anchor; a pair whose reported and estimated changes disagree in sign (the hidden part
    changed) teaches nothing either.
    """

    __slots__ = (
        "_anchor_estimate",
        "_anchor_reported",
        "_sum_estimate",
        "_sum_reported",
        "max_ratio",
        "min_delta",
        "min_ratio",
        "observations",
        "prior_tokens",
        "ratio",
    )

    ratio: float
    observations: int
    _sum_estimate: float
    _sum_reported: float
    _anchor_estimate: int | None
    _anchor_reported: int | None

    def __init__(
        self,
        *,
        min_ratio: float = 0.5,
        max_ratio: float = 2.0,
        prior_tokens: int = 500,
        min_delta: int = 32,
    ) -> None:
        if not (isinstance(min_ratio, int | float) and 0 < min_ratio <= 1):
            raise ConfigError("min_ratio", min_ratio, "a number in (0, 1]", owner="Calibration")
        if not (isinstance(max_ratio, int | float) and 1 <= max_ratio < math.inf):
            raise ConfigError("max_ratio", max_ratio, "a finite number >= 1", owner="Calibration")
        _non_negative_int("Calibration", "prior_tokens", prior_tokens)
        _non_negative_int("Calibration", "min_delta", min_delta)
        self.min_ratio = float(min_ratio)
        self.max_ratio = float(max_ratio)
        self.prior_tokens = prior_tokens
        self.min_delta = min_delta
        self.reset()

    @property
    def anchored(self) -> bool:
        return self._anchor_reported is not None

    @property
    def hidden_tokens(self) -> int | None:
        """What the provider counts that the counter does not see (``reported - ratio *
        estimate`` at the anchor), or None before the first observation."""
        if self._anchor_reported is None or self._anchor_estimate is None:
            return None
        return round(self._anchor_reported - self.ratio * self._anchor_estimate)

    def observe(self, estimate: int, reported: int) -> None:
        """Record one (raw estimate, reported input tokens) pair; ignores ``reported <= 0``."""
        if reported <= 0 or estimate < 0:
            return
        previous_estimate, previous_reported = self._anchor_estimate, self._anchor_reported
        if previous_estimate is not None and previous_reported is not None:
            delta = estimate - previous_estimate
            grew = reported - previous_reported
            if abs(delta) >= max(1, self.min_delta) and grew * delta > 0:
                sample = min(self.max_ratio, max(self.min_ratio, grew / delta))
                self._sum_estimate += abs(delta)
                self._sum_reported += sample * abs(delta)
                ratio = self._sum_reported / self._sum_estimate
                self.ratio = min(self.max_ratio, max(self.min_ratio, ratio))
        self._anchor_estimate = estimate
        self._anchor_reported = reported
        self.observations += 1

    def estimate(self, raw: int) -> int:
        """The calibrated estimate of a request whose raw count is ``raw``."""
        if self._anchor_reported is None or self._anchor_estimate is None:
            return raw
        return max(0, round(self._anchor_reported + self.ratio * (raw - self._anchor_estimate)))

    def raw_for(self, tokens: int) -> int:
        """How many raw (counter) tokens ``tokens`` calibrated tokens correspond to."""
        return math.ceil(tokens / self.ratio)

    def to_json(self) -> dict[str, Any]:
        """What it learned, as plain JSON (the bounds are configuration, not state)."""
        return {
            "ratio": self.ratio,
            "observations": self.observations,
            "sum_estimate": self._sum_estimate,
            "sum_reported": self._sum_reported,
            "anchor_estimate": self._anchor_estimate,
            "anchor_reported": self._anchor_reported,
        }

    def load_json(self, data: Mapping[str, Any]) -> Calibration:
        """Continue from what :meth:`to_json` dumped (ratio clamped to this one's bounds);
        returns self. A malformed document raises ValueError naming the key."""

        def number(key: str, *, optional: bool = False) -> Any:
            value = data.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Calibration state: {key} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Calibration state: {key} must be finite and >= 0")
            return value

        ratio = float(number("ratio"))
        observations = int(number("observations"))
        sums = float(number("sum_estimate")), float(number("sum_reported"))
        anchor_estimate = number("anchor_estimate", optional=True)
        anchor_reported = number("anchor_reported", optional=True)
        self.ratio = min(self.max_ratio, max(self.min_ratio, ratio))
        self.observations = observations
        self._sum_estimate, self._sum_reported = sums
        self._anchor_estimate = None if anchor_estimate is None else int(anchor_estimate)
        self._anchor_reported = None if anchor_reported is None else int(anchor_reported)
        return self

    def reset(self) -> None:
        """Forget every observation (ratio back to 1.0)."""
        self.ratio = 1.0
        self.observations = 0
        self._sum_estimate = float(self.prior_tokens)
        self._sum_reported = float(self.prior_tokens)
        self._anchor_estimate = None
        self._anchor_reported = None

    def __repr__(self) -> str:
        return (
            f"<Calibration ratio={self.ratio:.3f} hidden={self.hidden_tokens} "
            f"observations={self.observations}>"
        )


# ---------------------------------------------------------------------------------------
# model -> context window

MODEL_WINDOWS: FrozenDict[str, int] = FrozenDict(
    {
        # OpenAI
        "gpt-5": 400_000,
        "gpt-5-chat": 128_000,
        "gpt-4.1": 1_047_576,
        "gpt-4.5": 128_000,
        "gpt-4o": 128_000,
        "chatgpt-4o": 128_000,
        "gpt-4-turbo": 128_000,
        "gpt-4-1106": 128_000,
        "gpt-4-0125": 128_000,
        "gpt-4-32k": 32_768,
        "gpt-4": 8_192,
        "gpt-3.5-turbo": 16_385,
        "gpt-oss": 131_072,
        "o1": 200_000,
        "o1-mini": 128_000,
        "o1-preview": 128_000,
        "o3": 200_000,
        "o3-mini": 200_000,
        "o4-mini": 200_000,
        # Anthropic
        "claude": 200_000,
        "claude-2": 100_000,
        "claude-instant": 100_000,
        # Google
        "gemini": 1_048_576,
        "gemini-pro": 32_760,
        "gemini-1.0": 32_760,
        "gemini-1.5-pro": 2_097_152,
        "gemini-1.5-flash": 1_048_576,
        "gemma-2": 8_192,
        "gemma-3": 131_072,
        # Meta
        "llama-2": 4_096,
        "llama-3": 8_192,
        "llama3": 8_192,
        "llama-3.1": 131_072,
        "llama3.1": 131_072,
        "llama-3.2": 131_072,
        "llama3.2": 131_072,
        "llama-3.3": 131_072,
        "llama3.3": 131_072,
        "llama-4": 1_048_576,
        "llama-4-scout": 10_485_760,
        # Mistral
        "mistral": 32_768,
        "mistral-large": 131_072,
        "mistral-medium": 131_072,
        "mistral-small": 131_072,
        "mistral-nemo": 131_072,
        "open-mistral-nemo": 131_072,
        "open-mistral-7b": 32_768,
        "ministral": 131_072,
        "mixtral-8x7b": 32_768,
        "open-mixtral-8x7b": 32_768,
        "mixtral-8x22b": 65_536,
        "open-mixtral-8x22b": 65_536,
        "codestral": 262_144,
        "devstral": 131_072,
        "magistral": 40_960,
        "pixtral": 131_072,
        # Qwen
        "qwen": 32_768,
        "qwen-plus": 131_072,
        "qwen-turbo": 1_000_000,
        "qwen-max": 32_768,
        "qwen2": 32_768,
        "qwen2.5": 131_072,
        "qwen2.5-coder": 131_072,
        "qwen3": 131_072,
        "qwen3-coder": 262_144,
        "qwq": 131_072,
        # DeepSeek
        "deepseek": 131_072,
    }
)
"""Advertised context windows (tokens) by model-name prefix; the longest prefix wins."""

# "openai/gpt-4o", "models/gemini-2.0-flash", "us.anthropic.claude-3-5-sonnet-...:0",
# "meta-llama/Meta-Llama-3.1-8B-Instruct", "accounts/fireworks/models/qwen3-...": the family
# name starts after the last "/" and after a cloud vendor's dotted prefix.
_VENDOR = re.compile(
    r"^(?:(?:us|eu|apac|global)\.)?(?:anthropic|meta|mistral|amazon|cohere|ai21|google|openai)\."
    r"|^meta-(?=llama)"
)


def normalize_model_name(model: str) -> str:
    """Lower-case ``model`` and strip provider routing (``openai/``, ``us.anthropic.``...)."""
    name = model.strip().lower()
    name = name.rsplit("/", 1)[-1]
    return _VENDOR.sub("", name)


@functools.lru_cache(maxsize=1024)
def _default_window(name: str) -> int | None:
    return _longest_prefix(name, MODEL_WINDOWS)


def _longest_prefix(name: str, table: Mapping[str, int]) -> int | None:
    best_len, best = -1, None
    for prefix, window in table.items():
        if name.startswith(prefix) and len(prefix) > best_len:
            best_len, best = len(prefix), window
    return best


def context_window(model: str | None, table: Mapping[str, int] | None = None) -> int | None:
    """The context window of ``model`` by longest matching prefix, or None when unknown.

    ``table`` entries (same prefix rules, after normalization) are consulted first and win
    over :data:`MODEL_WINDOWS`.
    """
    if not model:
        return None
    name = normalize_model_name(model)
    if table:
        found = _longest_prefix(name, {normalize_model_name(k): v for k, v in table.items()})
        if found is not None:
            return found
    return _default_window(name)


def window_table(
    value: Mapping[str, int] | Iterable[tuple[str, int]] | None, *, owner: str = ""
) -> FrozenDict[str, int]:
    """A validated, normalized window table (model-name prefix -> tokens > 0)."""
    table = dict(value or {})
    for key, window in table.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(
                "windows", key, "model-name prefixes (non-empty strings)", owner=owner
            )
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise ConfigError(f"windows[{key!r}]", window, "an integer > 0 (tokens)", owner=owner)
    return FrozenDict({normalize_model_name(k): v for k, v in table.items()})
