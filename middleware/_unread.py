"""What session memory's next extraction reads: every message committed since the last
extraction, as committed, in this session and across sessions of the thread.

In a session the messages come from a :class:`~tinyctx.conversation.MessageTap` on the
conversation. The thread state keeps them too, so that a later session (another request,
another process) reads the same originals: a message still in the stored history as it was
committed is kept by its fingerprint (it is found in the loaded history again), and one a
rewrite took out of the conversation (a cleared tool result, a summarized or trimmed head)
is kept as its codec document, because the stored history no longer holds it as it was.

The durable record is a snapshot taken when a run ends and when an extraction
completes, not at every step: the layer state is written with the thread at every step,
and a long run would otherwise rewrite its growing record each time. It also marks how
far the history went at the snapshot, so what a later step committed (a run a crash cut
short) is read from the stored history after that mark. It is bounded: at most the newest
:data:`KEEP_MESSAGES` unread messages in at most :data:`KEEP_BYTES` (a thread whose
extraction never comes, a model that reports no usage for the token threshold, does not
grow its state without end). Within a session nothing is dropped; what the bound leaves
out (the oldest) a later session does not read.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from tinyctx import Message
from tinyctx.codec import CodecError, decode_message, encode_message
from tinyctx.conversation import Conversation, MessageTap

__all__ = ["Unread", "fingerprint", "KEEP_MESSAGES", "KEEP_BYTES"]

KEEP_MESSAGES = 256
"""The most unread messages the thread state keeps for a later session (the newest)."""

KEEP_BYTES = 64 << 10
"""The most bytes of the record (documents and fingerprints) the thread state keeps: the
thread state is written with every step, so it bounds what the record adds to a write."""


def fingerprint(message: Message) -> str:
    """A stable short digest of a message (kind, text, tool-call ids) across processes."""
    ids = ",".join(c.id for c in getattr(message, "tool_calls", ()))
    call_id = getattr(message, "tool_call_id", "")
    raw = f"{type(message).__name__}\0{message.text}\0{ids}\0{call_id}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class Unread:
    """The messages the next extraction reads (durable with the layer's thread state).

    :meth:`open` starts recording on a conversation; until then (a state restored in a new
    session) it holds what the stored state said. The JSON form is the last
    :meth:`snapshot`: ``entries``, one per message, oldest first (``{"seen": fingerprint}``
    for one the stored history holds as committed, ``{"message": document}`` for one it
    does not), and ``upto`` / ``last``, the history's length and its last message's
    fingerprint at the snapshot.
    """

    __slots__ = ("_documents", "_prints", "_snapshot", "restored", "tap")

    def __init__(self) -> None:
        self.tap: MessageTap | None = None
        # a restored record (entries, upto, last), resolved against the loaded history on open
        self.restored: tuple[list[str | Message], int, str | None] | None = None
        # the record as last snapshotted (what the thread state holds), None: no record
        self._snapshot: dict[str, Any] | None = None
        # per held message (by id; each is alive, held by the tap): its fingerprint and
        # document, computed once
        self._prints: dict[int, str] = {}
        self._documents: dict[int, str] = {}

    @property
    def is_open(self) -> bool:
        return self.tap is not None

    def open(self, conversation: Conversation, since: int) -> None:
        """Record from now on; the backlog is what a restored record listed (found again in
        the loaded history) and what the history holds after its mark, else (no record)
        the history after the last extraction's mark."""
        messages = conversation.messages
        restored, self.restored = self.restored, None
        if restored is None:
            backlog: list[Message] = list(messages[since:])
        else:
            entries, upto, last = restored
            backlog = _resolve(entries, messages)
            backlog += _after(messages, upto, last, backlog)
        self.tap = conversation.tap(backlog)

    def close(self) -> None:
        if self.tap is not None:
            self.tap.close()
        self.tap = None
        self._prints.clear()
        self._documents.clear()

    @property
    def messages(self) -> tuple[Message, ...]:
        return self.tap.messages if self.tap is not None else ()

    def drop(self, count: int) -> None:
        """The oldest ``count`` were read by an extraction that completed."""
        tap = self.tap
        if tap is None:
            return
        for message in tap.messages[:count]:
            self._prints.pop(id(message), None)
            self._documents.pop(id(message), None)
        tap.drop(count)

    def in_history(self) -> int:
        """How many of the unread messages the conversation still holds as committed."""
        tap = self.tap
        if tap is None:
            return 0
        return sum(1 for m in tap.messages if not tap.is_displaced(m))

    def snapshot(self, conversation: Conversation) -> None:
        """Take the record the thread state keeps from now on (see the module docstring)."""
        tap = self.tap
        if tap is None:
            return
        entries: list[dict[str, str]] = []
        room = KEEP_BYTES
        held = tap.messages
        for message in reversed(held[-KEEP_MESSAGES:]):  # newest first, within the bound
            key = id(message)
            if tap.is_displaced(message):
                document = self._documents.get(key)
                if document is None:
                    document = self._documents[key] = encode_message(message)
                room -= len(document)
                entry = {"message": document}
            else:
                mark = self._prints.get(key)
                if mark is None:
                    mark = self._prints[key] = fingerprint(message)
                room -= len(mark) + 12
                entry = {"seen": mark}
            if room < 0:
                break
            entries.append(entry)
        entries.reverse()
        messages = conversation.messages
        last = fingerprint(messages[-1]) if messages else None
        self._snapshot = {"entries": entries, "upto": len(messages), "last": last}

    def to_json(self) -> dict[str, Any] | None:
        if self.tap is None and self.restored is not None:
            entries, upto, last = self.restored
            return {"entries": [_entry(e) for e in entries], "upto": upto, "last": last}
        return self._snapshot

    @classmethod
    def from_json(cls, data: Any) -> Unread:
        """The unread messages of a stored state (None: a state written before they were
        kept, whose next extraction reads the history after its mark)."""
        unread = cls()
        if data is None:
            return unread
        where = "SessionMemory state: unread"
        if not isinstance(data, dict) or set(data) != {"entries", "upto", "last"}:
            raise TypeError(f"{where} must be an object with entries, upto and last")
        upto, last, raw = data["upto"], data["last"], data["entries"]
        if isinstance(upto, bool) or not isinstance(upto, int) or upto < 0:
            raise ValueError(f"{where}.upto must be an integer >= 0, got {upto!r}")
        if last is not None and not isinstance(last, str):
            raise ValueError(f"{where}.last must be a string or null, got {last!r}")
        if not isinstance(raw, list):
            raise TypeError(f"{where}.entries must be a list, got {raw!r}")
        entries: list[str | Message] = []
        for index, entry in enumerate(raw):
            at = f"{where}.entries[{index}]"
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"{at} must be {{'seen': str}} or {{'message': str}}")
            ((kind, value),) = entry.items()
            if not isinstance(value, str) or kind not in ("seen", "message"):
                raise ValueError(f"{at} must be {{'seen': str}} or {{'message': str}}")
            if kind == "seen":
                entries.append(value)
                continue
            try:
                entries.append(decode_message(value))
            except CodecError as exc:
                raise ValueError(f"{at}.message: {exc}") from exc
        unread.restored = (entries, upto, last)
        unread._snapshot = unread.to_json()
        return unread


def _entry(entry: str | Message) -> dict[str, str]:
    if isinstance(entry, str):
        return {"seen": entry}
    return {"message": encode_message(entry)}


def _after(
    messages: tuple[Message, ...], upto: int, last: str | None, found: list[Message]
) -> list[Message]:
    """What the loaded history holds past the snapshot's mark (committed later, e.g. in a
    run a crash cut short): from ``upto`` when its last message is the one marked, else
    after the newest message of the record found in it (none: nothing more)."""
    if upto <= len(messages) and (
        (upto == 0 and last is None)
        or (upto > 0 and last is not None and fingerprint(messages[upto - 1]) == last)
    ):
        return list(messages[upto:])
    held = {id(m) for m in found}
    for index in range(len(messages) - 1, -1, -1):
        if id(messages[index]) in held:
            return list(messages[index + 1 :])
    return []


def _resolve(entries: list[str | Message], messages: tuple[Message, ...]) -> list[Message]:
    """The restored entries as messages: a fingerprint is matched, in order, against the
    loaded history (newest matches last; one not found is left out: the history was
    rewritten without this layer's state, e.g. by hand)."""
    needed = Counter(entry for entry in entries if isinstance(entry, str))
    missing = sum(needed.values())
    by_print: dict[str, list[Message]] = {}
    for message in reversed(messages):  # they are the newest: the scan stops early
        if not missing:
            break
        mark = fingerprint(message)
        if needed.get(mark, 0) > 0:
            needed[mark] -= 1
            missing -= 1
            by_print.setdefault(mark, []).insert(0, message)
    found: list[Message] = []
    for entry in entries:
        if not isinstance(entry, str):
            found.append(entry)
            continue
        matches = by_print.get(entry)
        if matches:
            found.append(matches.pop(0))
    return found
