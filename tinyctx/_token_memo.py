"""The memo engine under every built-in counter: a message's payload text and its cached count."""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from operator import call as _call
from typing import TYPE_CHECKING, Any, Final

from .config import integer, one_of
from .conversation import snapshot_stamp
from .frozen import SET_JSON_CHARS, FrozenDict
from .media_tokens import IMAGE_FORMULAS, ImageFormula, media_tokens
from .messages import AssistantMessage, Message, ToolCall, ToolResult
from .model import ModelRequest
from .parts import Content
from .tools import ToolSpec

if TYPE_CHECKING:
    pass


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
    SET_JSON_CHARS(arguments, chars)
    return chars


# bytes.translate(None, delete) tables: what JSON does NOT escape in a string (so deleting it
# leaves the escaped characters), and the escaped ones written in two characters (\" \\ \b
# \f \n \r \t; the other control characters take six, \u00XX)
_NOT_JSON_ESCAPED = bytes(b for b in range(0x20, 256) if b not in b'"\\')
_SHORT_ESCAPES = b'"\\\b\f\n\r\t'


_SAME_IN_ORJSON: Final = frozenset((str, int, bool, type(None)))
"""Values orjson writes as the stdlib encoder does (floats it may write shorter: 1e-07)."""


def flat_orjson(data: Mapping[str, Any]) -> bytes | None:
    """orjson's compact JSON of a non-empty object of strings, integers, booleans and nulls
    (the stdlib encoder writes the same plus a space after each ',' and ':'), or None for
    other values (floats orjson may write shorter, nested values) or without orjson."""
    if _orjson_dumps is None or not (
        # most calls pass one argument: its type alone, without a set of them
        type(*data.values()) in _SAME_IN_ORJSON
        if len(data) == 1
        else _SAME_IN_ORJSON.issuperset(map(type, data.values()))
    ):
        return None
    try:
        return _orjson_dumps(data)
    except TypeError:  # a key that is not a string, an integer past 64 bits
        return None


def _flat_json_chars(data: Mapping[str, Any]) -> int | None:
    """What :func:`_json_chars` measures, for an object of strings, integers, finite floats,
    booleans and nulls, without the stdlib encoder: orjson's compact text plus the spaces it
    leaves out, or (with a float, which orjson may write shorter) the lengths of the keys
    and values plus what their escapes add; -1 when a string is not ASCII, None when a value
    is nested (the caller encodes it)."""
    if not data:
        return 2
    # orjson writes the same text minus the spaces after ',' and ':' (which never touch a
    # run of spaces) in one C call: cheaper than a pass per string here
    text = flat_orjson(data)
    if text is not None:
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


_AT_LEAST_ZERO = integer(minimum=0)


def _non_negative_int(owner: str, name: str, value: Any) -> int:
    return _AT_LEAST_ZERO.check(value, name, owner)


class _KeyedRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that remembers the memo key of its message (set ``key`` after
    building it: with no Python ``__new__``/``__init__`` one costs a quarter as much)."""

    __slots__ = ("key",)
    key: int


class _Hot:
    """The history counted last, held strongly, with the counts of its messages from
    ``start`` on (``pending``) that are not yet remembered by weak reference, and its
    :func:`~tinyctx.conversation.snapshot_stamp` (None: no conversation vouches for it)."""

    __slots__ = ("messages", "pending", "stamp", "start", "total")

    def __init__(
        self,
        messages: tuple[Message, ...],
        total: int,
        start: int,
        pending: list[int],
        stamp: tuple[object, int] | None,
    ) -> None:
        self.messages = messages
        self.total = total
        self.start = start
        self.pending = pending
        self.stamp = stamp


def _same_log(stamp: tuple[object, int], held: tuple[object, ...] | None) -> bool:
    """Whether two snapshot stamps are of the same conversation with no rewrite between
    (the later snapshot then starts with every message of the earlier)."""
    return held is not None and stamp[0] is held[0] and stamp[1] == held[1]


class MemoCounter:
    """The memoizing core both built-in counters share.

    Subclasses implement :meth:`count_text` (and may override :meth:`count_texts` to
    count many strings at once). Everything else is memoized here:

    - per history: the history counted last is held (strongly) with its total and its
      messages' counts, so re-counting it is an identity check and a history that only
      grew since costs its new messages plus a check that it starts with the held one:
      O(1) when a :class:`~tinyctx.conversation.Conversation` made both and vouches so
      (:func:`~tinyctx.conversation.snapshot_stamp`), else a prefix comparison; a cold count builds
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
      a conversation's snapshot leaves instead its total with the conversation's stamp
      (the conversation held weakly, the 64 most recent): handed over in O(1), no weak
      reference per message;
    - per tool list (by identity) and per system prompt (by value).

    Images and documents in a message's content parts are counted by the ``images``
    formula ("anthropic", the default, or "openai"; see :mod:`tinyctx.media_tokens`) and
    memoized with the message.

    Args:
        message_overhead: Tokens added per message (role and framing).
        tool_call_overhead: Tokens added per tool call of an assistant message.
        tool_overhead: Tokens added per tool schema of a request.
        request_overhead: Tokens added once per request.
        max_memo: The most messages memoized (at least 2).
        images: The image formula, "anthropic" or "openai".
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
        one_of(IMAGE_FORMULAS, allowed=f"one of {IMAGE_FORMULAS}").check(images, "images", owner)
        self.images: ImageFormula = images
        self.message_overhead = _non_negative_int(owner, "message_overhead", message_overhead)
        self.tool_call_overhead = _non_negative_int(owner, "tool_call_overhead", tool_call_overhead)
        self.tool_overhead = _non_negative_int(owner, "tool_overhead", tool_overhead)
        self.request_overhead = _non_negative_int(owner, "request_overhead", request_overhead)
        integer(minimum=2).check(max_memo, "max_memo", owner)
        self._max_memo = max_memo
        self._counts: dict[int, int] = {}
        self._alive: dict[int, _KeyedRef] = {}
        # first message's id -> weak refs to a counted history and its total
        self._prefix: dict[int, tuple[tuple[_KeyedRef, ...], int]] = {}
        # id of a conversation's stamp token -> the token, its rewrites, the length and
        # the total of its snapshot counted last (the 64 most recent)
        self._logs: dict[int, tuple[object, int, int, int]] = {}
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
        self._logs.clear()
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
        keys = list(map(id, messages))
        if memo and any(map(alive.__contains__, keys)):  # C speed when none is (a handover)
            new = [(m, c) for m, c in zip(messages, counts, strict=True) if id(m) not in alive]
            if not new:
                return
            messages, counts = [m for m, _ in new], [c for _, c in new]
            keys = list(map(id, messages))
        overflow = len(memo) + len(messages) - limit
        if overflow > 0:
            # forget the oldest (dicts keep insertion order), at least half of the memo so
            # eviction stays rare; prefix totals go too, their messages may be forgotten
            # (the survivors copied at C speed: deleting half a full memo key by key costs
            # more than a cold count of the history that overflowed it)
            drop = min(len(memo), max(overflow, len(memo) // 2))
            memo = self._counts = dict(islice(memo.items(), drop, None))
            alive = self._alive = dict(zip(memo, map(alive.__getitem__, memo), strict=True))
            self._prefix.clear()
        start = max(0, len(messages) - limit)
        if start:
            messages, counts, keys = messages[start:], counts[start:], keys[start:]
        forget = self._forget
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
        """Another history is counted: the last one is held no more. A conversation's
        snapshot leaves its total with the conversation's stamp (O(1): the conversation,
        held weakly, vouches for its head when it comes back grown); any other history's
        counts and total (as a prefix entry) are remembered by weak reference, one per
        message."""
        self._hot = None
        stamp = hot.stamp
        if stamp is not None:
            logs, key = self._logs, id(stamp[0])
            if key not in logs and len(logs) >= 64:
                del logs[next(iter(logs))]
            logs[key] = (stamp[0], stamp[1], len(hot.messages), hot.total)
            return
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
        ends = (messages[0], messages[len(messages) // 2], messages[-1])
        if not any(id(m) in memo for m in ends):
            # never seen, most likely (a handover keeps a head, a compaction a middle or
            # a tail): measured whole without a look-up per message in a large memo
            return self._message_counts(messages)
        counts = list(map(memo.get, map(id, messages)))
        if counts.count(None) == len(counts):  # a history never seen: measure it whole
            return self._message_counts(messages)
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
            stamp = snapshot_stamp(messages) if len(messages) >= k else None
            if (stamp is not None and _same_log(stamp, hot.stamp)) or (
                len(messages) >= k and messages[k - 1] is held[-1] and messages[:k] == held
            ):
                # it only grew: its conversation vouches so (no rewrite since, O(1)), or
                # its head is the held history (equal messages have equal counts, so the
                # total still holds)
                hot.messages, hot.stamp = messages, stamp
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
        stamp = snapshot_stamp(messages)
        if stamp is not None:
            log = self._logs.get(id(stamp[0]))
            if log is not None and _same_log(stamp, log[:2]) and len(messages) >= log[2]:
                # its conversation vouches that it starts with the snapshot counted then
                k = log[2]
                new = self._counts_of(messages[k:])
                return _Hot(messages, log[3] + sum(new), k, new, stamp)
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
                return _Hot(messages, total + sum(new), k, new, stamp)
        counts = self._counts_of(messages)
        return _Hot(messages, sum(counts), 0, counts, stamp)

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
