"""What session memory's next extraction reads: every message committed since the last
extraction, as committed, in this session and across sessions of the thread.

In a session the messages come from a :class:`~tinyctx.MessageTap` on the conversation. The
thread state keeps them too, so that a later session (another request, another process)
reads the same originals: a message still in the stored history as it was committed is
kept by its fingerprint (it is found in the loaded history again), and one a rewrite took
out of the conversation (a cleared tool result, a summarized or trimmed head) is kept as
its codec document, because the stored history no longer holds it as it was.

The durable form is bounded, since it is written with the thread at every step: at most
the newest :data:`KEEP_MESSAGES` unread messages, and of their documents at most
:data:`KEEP_BYTES` (a thread whose extraction never comes, a model that reports no usage
for the token threshold, does not grow its state without end). Within a session nothing
is dropped; what the bound leaves out (the oldest) a later session does not read.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from tinyctx import Conversation, Message, MessageTap
from tinyctx.codec import CodecError, decode_message, encode_message

__all__ = ["Unread", "fingerprint", "KEEP_MESSAGES", "KEEP_BYTES"]

KEEP_MESSAGES = 2000
"""The most unread messages the thread state keeps for a later session (the newest)."""

KEEP_BYTES = 1 << 20
"""The most bytes of documents of displaced unread messages the thread state keeps."""


def fingerprint(message: Message) -> str:
    """A stable short digest of a message (kind, text, tool-call ids) across processes."""
    ids = ",".join(c.id for c in getattr(message, "tool_calls", ()))
    call_id = getattr(message, "tool_call_id", "")
    raw = f"{type(message).__name__}\0{message.text}\0{ids}\0{call_id}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class Unread:
    """The messages the next extraction reads (durable with the layer's thread state).

    :meth:`open` starts recording on a conversation; until then (a state restored in a new
    session) it holds what the stored state said. The JSON form lists one entry per
    message, oldest first: ``{"seen": fingerprint}`` for one the stored history holds as
    committed, ``{"message": document}`` for one it does not.
    """

    __slots__ = ("_documents", "_prints", "restored", "tap")

    def __init__(self) -> None:
        self.tap: MessageTap | None = None
        # entries of a restored state, resolved against the loaded history on open
        self.restored: list[str | Message] | None = None
        # per held message (by id; each is alive, held by the tap): its fingerprint and
        # document, computed once (the state is written at every step)
        self._prints: dict[int, str] = {}
        self._documents: dict[int, str] = {}

    @property
    def is_open(self) -> bool:
        return self.tap is not None

    def open(self, conversation: Conversation, since: int) -> None:
        """Record from now on; the backlog is what a restored state listed (found again in
        the loaded history), else the history after the last extraction's mark."""
        messages = conversation.messages
        restored, self.restored = self.restored, None
        if restored is None:
            backlog: list[Message] = list(messages[since:])
        else:
            backlog = _resolve(restored, messages)
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

    def to_json(self) -> list[dict[str, str]] | None:
        tap = self.tap
        if tap is None:
            if self.restored is None:
                return None
            return [_restored_entry(entry) for entry in self.restored]
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
                if room < 0:
                    break
                entries.append({"message": document})
            else:
                mark = self._prints.get(key)
                if mark is None:
                    mark = self._prints[key] = fingerprint(message)
                entries.append({"seen": mark})
        entries.reverse()
        return entries

    @classmethod
    def from_json(cls, data: Any) -> Unread:
        """The unread messages of a stored state (None: a state written before they were
        kept, whose next extraction reads the history after its mark)."""
        unread = cls()
        if data is None:
            return unread
        if not isinstance(data, list):
            raise TypeError(f"SessionMemory state: unread must be a list, got {data!r}")
        restored: list[str | Message] = []
        for index, entry in enumerate(data):
            where = f"SessionMemory state: unread[{index}]"
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"{where} must be {{'seen': ...}} or {{'message': ...}}")
            ((kind, value),) = entry.items()
            if not isinstance(value, str) or kind not in ("seen", "message"):
                raise ValueError(f"{where} must be {{'seen': str}} or {{'message': str}}")
            if kind == "seen":
                restored.append(value)
                continue
            try:
                restored.append(decode_message(value))
            except CodecError as exc:
                raise ValueError(f"{where}.message: {exc}") from exc
        unread.restored = restored
        return unread


def _restored_entry(entry: str | Message) -> dict[str, str]:
    if isinstance(entry, str):
        return {"seen": entry}
    return {"message": encode_message(entry)}


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
