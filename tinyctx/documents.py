"""A message document's text apart from the rest, for stores that keep text as text.

Most of a long thread's bytes are message text (tool output, code). Inside a JSON document
that text is escaped, and reading it back means unescaping every character; a database
column of its own returns it as it is. :func:`split_document` takes a document apart
(exactly: :func:`join_document` restores it byte for byte), :class:`SplitDocuments` reads
as the documents again, and :func:`tinyctx.codec.decode_messages` decodes it without
joining. The codec still defines every byte of a document; this is how one is kept.
"""

from __future__ import annotations

import json.encoder
from _json import scanstring as _scan_string  # the C scanner json.decoder uses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, overload

__all__ = ["split_document", "join_document", "SplitDocuments", "TEXT_HOLE"]

_CONTENT_HEAD: Final = '{"content":'
TEXT_HOLE: Final = '{"content":null'
"""How a split document's head starts: the text's place, held by ``null``."""
_HOLE_END: Final = len(TEXT_HOLE)
_encode_string: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


def split_document(doc: str) -> tuple[str, str | None]:
    """``(head, text)``: a message document whose text content is its first member, taken
    apart, so a store can keep the text as text (read back without JSON unescaping) and
    the rest as a small document; ``(doc, None)`` for any other string.

    The head is the document with the text replaced by ``null``: valid JSON exactly when
    the document is, and a document no reader takes for a message without its text (every
    role refuses a ``null`` content, so a process of an older release reading the head
    alone fails loudly instead of reading an assistant message with no text).

    ``join_document(*split_document(doc)) == doc`` for every string, byte for byte: only
    a text spelled exactly as the encoder spells it is taken out, and the rest is kept
    verbatim. A text that is not valid Unicode (a lone surrogate) stays in the document,
    where its escape keeps it exact.
    """
    if type(doc) is not str or not doc.startswith('{"content":"'):
        return doc, None
    try:
        text, end = _scan_string(doc, 12)
    except ValueError:  # not a JSON string
        return doc, None
    spelled = _encode_string(text)
    if len(spelled) != end - 11 or not doc.startswith(spelled, 11):
        return doc, None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return doc, None
    return TEXT_HOLE + doc[end:], text


def join_document(head: str, text: str | None) -> str:
    """The document :func:`split_document` took apart (``ValueError`` for a pair it did
    not make: a text beside a head without its hole)."""
    if text is None:
        return head
    if not head.startswith(TEXT_HOLE):
        raise ValueError(f"a split document's head starts with {TEXT_HOLE!r}, got {head[:20]!r}")
    return f"{_CONTENT_HEAD}{_encode_string(text)}{head[_HOLE_END:]}"


class SplitDocuments(Sequence[str]):
    """Message documents kept as :func:`split_document` pairs: a sequence of documents
    (each joined when it is read) that :func:`decode_messages` decodes without joining,
    so a long text is never escaped into JSON and parsed back out."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[tuple[str, str | None]]) -> None:
        self._rows: tuple[tuple[str, str | None], ...] = tuple(rows)

    @property
    def rows(self) -> tuple[tuple[str, str | None], ...]:
        """The ``(head, text)`` pairs."""
        return self._rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> SplitDocuments: ...
    def __getitem__(self, index: int | slice) -> str | SplitDocuments:
        if isinstance(index, slice):
            return SplitDocuments(self._rows[index])
        return join_document(*self._rows[index])

    def __iter__(self) -> Iterator[str]:
        return (join_document(head, text) for head, text in self._rows)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SplitDocuments):
            return self._rows == other._rows or tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"SplitDocuments({tuple(self)!r})"
