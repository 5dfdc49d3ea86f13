"""What a framework's message objects were converted to, kept while each object lives.

A framework hands an adapter its whole history on every call, as the same (mutable)
objects plus the new ones; converting all of them each time makes a call cost the
thread's length. :class:`ConversionMemo` keeps each object's conversion beside a private
copy (a snapshot) of the mutable side, and a conversion is used only while that side still
equals its snapshot: a message edited in place is converted again, never answered from
the memo.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["ConversionMemo", "copy_of"]

V = TypeVar("V")


class ConversionMemo(Generic[V]):
    """Object -> (snapshot, its conversion), while the object lives."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # id(object) -> (a weak reference to it, what it said, its conversion)
        self._entries: dict[int, tuple[weakref.ref[Any], Any, V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, obj: object) -> tuple[Any, V] | None:
        """``(snapshot, conversion)`` kept for ``obj``, if it was converted; the caller
        checks that what the snapshot covers still says the same (``==``)."""
        entry = self._entries.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return None
        return entry[1], entry[2]

    def put(self, obj: object, snapshot: Any, value: V) -> None:
        """Keep ``value`` for ``obj`` while it lives, with ``snapshot``: a copy of what it
        covers now that nothing else holds (later edits must not reach it)."""
        key = id(obj)
        entries = self._entries

        def forget(ref: weakref.ref[Any]) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(obj, forget), snapshot, value)


def copy_of(value: V) -> V | None:
    """A deep copy of ``value`` that shares nothing mutable with it, or None when it cannot
    be copied (then it is not memoized). Made once per message converted, never stored."""
    try:
        copied: V = copy.deepcopy(value)
    except Exception:  # whatever copying refuses (or a warning raised), the memo does without
        return None
    return copied
