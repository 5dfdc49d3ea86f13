"""The store protocols: what a layer, a tool or a context needs of a store.

A :class:`Store` is what a layer or tool writes to when something must survive the run
(session-memory notes, caches keyed by thread or user). A :class:`StoreRegistry` names
the stores a context carries; it is shared by every derived context. Kept apart from the
backends (:mod:`tinyctx.backends`) so a context loads no database driver or SQLite code
to name one. The argument checks here are the ones every store implementation shares.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from .config import Check, number, optional
from .frozen import EMPTY, FrozenDict, frozen_mapping, thaw
from .messages import valid_text
from .threads import Lease, check_thread_id

__all__ = [
    "check_archive_retention",
    "Store",
    "Note",
    "StoreRegistry",
    "NoteBatchStore",
    "NoteDeleteStore",
    "append_notes",
    "check_fence",
    "check_lease",
    "check_list_args",
    "check_notes_limit",
    "encode_json",
    "note_texts",
]


_SECONDS_OR_NONE: Check[float | None] = optional(
    number(minimum=0, finite=False), allowed="None (keep forever) or seconds >= 0"
)


def check_archive_retention(value: object, owner: str) -> float | None:
    """Every store's ``archive_retention``: how long compacted originals stay readable
    (None: forever), as a float; a ConfigError naming ``owner`` otherwise."""
    checked = _SECONDS_OR_NONE.check(value, "archive_retention", owner)
    return None if checked is None else float(checked)


@frozen
class Note:
    """One append-only note: ``seq`` orders notes within a namespace."""

    namespace: str
    seq: int
    text: str
    created_at: float
    metadata: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)


@runtime_checkable
class Store(Protocol):
    """Namespaced key/value data plus append-only, timestamped notes."""

    async def get(self, namespace: str, key: str) -> Any | None: ...

    async def put(self, namespace: str, key: str, value: Any) -> None: ...

    async def delete(self, namespace: str, key: str) -> bool: ...

    async def keys(self, namespace: str) -> list[str]: ...

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note: ...

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; ``limit`` keeps the newest ``limit`` (0: none, None: all;
        a negative limit is a ValueError)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class NoteBatchStore(Protocol):
    """A store that appends several notes in one atomic step (all of them or none).

    The built-in stores also take ``fence=``: a thread's :class:`~tinyctx.threads.Lease`,
    checked in the same atomic step as the append, exactly like a thread write's lease.
    """

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Note]: ...


@runtime_checkable
class NoteDeleteStore(Protocol):
    """A store that can erase one namespace's notes (one user's data, on request)."""

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace``; how many were removed (0 if none)."""
        ...


async def append_notes(
    store: Store,
    namespace: str,
    texts: Sequence[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    fence: Lease | None = None,
) -> list[Note]:
    """Append ``texts`` as notes, atomically when ``store`` is a :class:`NoteBatchStore`.

    A store with only ``append_note`` gets them one by one (a failure part-way keeps the
    notes already appended: such a store cannot do better).

    ``fence``: a thread's lease (``ctx.thread_lease()``). A store whose ``append_notes``
    takes ``fence=`` (every built-in one) appends only while that lease's token is still
    the thread's newest, in the same atomic step, else raises
    :class:`~tinyctx.threads.FencedOut` with nothing written. Other stores append
    unfenced.
    """
    if not texts:
        return []
    if isinstance(store, NoteBatchStore):
        if fence is not None and _takes_fence(store):
            append: Any = store.append_notes
            notes: list[Note] = await append(namespace, texts, metadata=metadata, fence=fence)
            return notes
        return await store.append_notes(namespace, texts, metadata=metadata)
    return [await store.append_note(namespace, text, metadata=metadata) for text in texts]


def _takes_fence(store: NoteBatchStore) -> bool:
    """Whether ``store.append_notes`` accepts ``fence=`` (asked each time: a wrapper that
    delegates may wrap stores of either kind)."""
    try:
        parameters = inspect.signature(store.append_notes).parameters
    except (TypeError, ValueError):
        return False
    return "fence" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def check_fence(fence: Lease | None) -> None:
    """``fence=`` must be None or a :class:`~tinyctx.threads.Lease` (TypeError otherwise)."""
    if fence is not None and not isinstance(fence, Lease):
        raise TypeError(f"append_notes(fence=...) must be a Lease or None, got {fence!r}")
    if fence is not None:
        check_thread_id(fence.thread_id)


def check_lease(lease: object, method: str) -> Lease:
    """``lease`` for ``renew_lease``/``release_lease``: a Lease of a valid thread id."""
    if not isinstance(lease, Lease):
        raise TypeError(f"{method} needs a Lease, got {type(lease).__name__}")
    check_thread_id(lease.thread_id)
    return lease


def check_list_args(prefix: str, limit: int | None) -> None:
    """``list_threads(prefix=..., limit=...)``: a valid id prefix and None or an int >= 0."""
    if not isinstance(prefix, str):
        raise TypeError(f"list_threads(prefix=...) must be a str, got {type(prefix).__name__}")
    check_thread_id(prefix, field="prefix")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"list_threads(limit={limit!r}): limit must be None or an integer >= 0")


_NO_STORES: dict[str, Store] = {}


class StoreRegistry(Mapping[str, Store]):
    """The named stores a context carries (read-only once built)."""

    __slots__ = ("_stores",)

    def __init__(self, stores: Mapping[str, Store] | None = None) -> None:
        found: dict[str, Store] = {}
        for name, store in (stores or {}).items():
            if not isinstance(store, Store):
                raise TypeError(
                    f"stores[{name!r}] does not implement the tinyctx.stores.Store protocol"
                )
            found[name] = store
        # read-only once built: every registry without a store shares one empty dict
        self._stores: dict[str, Store] = found or _NO_STORES

    def __getitem__(self, name: str) -> Store:
        try:
            return self._stores[name]
        except KeyError:
            known = ", ".join(sorted(self._stores)) or "none"
            raise KeyError(f"no store named {name!r} in this context (known: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    def __repr__(self) -> str:
        return f"<StoreRegistry {sorted(self._stores)}>"

    def with_store(self, name: str, store: Store) -> StoreRegistry:
        """A new registry that also has ``store`` under ``name``."""
        return StoreRegistry({**self._stores, name: store})


def note_texts(texts: Sequence[object]) -> tuple[str, ...]:
    """``append_notes``' texts, each a valid str (TypeError naming the first that is not)."""
    if isinstance(texts, str):
        raise TypeError("append_notes: texts must be a sequence of strings, not one string")
    result: list[str] = []
    for index, text in enumerate(texts):
        if isinstance(text, str):
            result.append(valid_text(text))
        else:
            kind = type(text).__name__
            raise TypeError(f"append_notes: texts[{index}] must be a str, got {kind}")
    return tuple(result)


def check_notes_limit(limit: int | None) -> None:
    """``notes(limit=...)``: None or an integer >= 0 (ValueError otherwise)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"notes(limit={limit!r}): limit must be None or an integer >= 0")


# ---------------------------------------------------------------------------------------


def encode_json(value: Any, what: str, *, owner: str) -> str:
    """``value`` as compact JSON; a value that is not JSON is a TypeError naming ``owner``
    and ``what`` (raised before the store writes anything)."""
    try:
        return json.dumps(thaw(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{owner}: {what} must be JSON-serializable ({exc})") from None
