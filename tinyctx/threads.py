"""The ThreadStore contract: durable threads as pure storage.

A store keeps, per thread, an append-only log of encoded messages (the live history), the
archive of ranges a compaction replaced, the pending checkpoint of an interrupted run, the
layers' per-thread state, and a lease. It decides nothing: which messages to compact, when
to checkpoint, what a layer keeps — all of that stays in the session and its layers. So one
conformance suite holds every backend (memory, SQLite, PostgreSQL, Redis) to one behaviour.

Values cross the store as *encoded documents* (``str``, canonical JSON from
:mod:`tinyctx.codec`), so a backend never imports a message type and bytes written are
exactly the bytes read back.

Every change to a thread is one :meth:`ThreadStore.write`: a compaction, appended messages,
a checkpoint and layer state land together or not at all, against an ``expected_version``
(optimistic concurrency) and, when given, a :class:`Lease` whose fencing token must still be
the thread's newest.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final, Literal, Protocol, runtime_checkable

from attrs import field, frozen

from .errors import SessionBusy, TinyCtxError

__all__ = [
    "UNCHANGED",
    "Unchanged",
    "Lease",
    "Compaction",
    "ThreadWrite",
    "ThreadRecord",
    "ArchivedRange",
    "ThreadStore",
    "StaleThreadVersion",
    "LeaseHeld",
    "FencedOut",
    "InvalidThreadId",
    "THREAD_ID_MAX_LENGTH",
    "THREAD_ID_RULE",
    "check_thread_id",
    "check_write_range",
    "validate_write",
    "validate_lease_request",
]

THREAD_ID_MAX_LENGTH: Final = 256
"""The longest thread id every store accepts, in characters (at most 1 KiB of UTF-8)."""

THREAD_ID_RULE: Final = (
    f"a str of 1 to {THREAD_ID_MAX_LENGTH} characters, without control characters "
    "(U+0000-U+001F, U+007F-U+009F) or lone surrogates (U+D800-U+DFFF)"
)
"""What a thread id may be, on every store (the same check everywhere)."""

_PREFIX_RULE: Final = THREAD_ID_RULE.replace("of 1 to", "of 0 to")

# what no thread id may contain: control characters (NUL, which PostgreSQL text cannot
# hold, among them) and surrogates (not Unicode scalar values: no UTF-8 encoding exists)
_FORBIDDEN_IN_IDS: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _shown(value: str) -> str:
    """``value`` for an error message: its repr, cut after 40 characters."""
    if len(value) <= 40:
        return repr(value)
    return f"{value[:40]!r}... ({len(value)} characters)"


class InvalidThreadId(TinyCtxError, ValueError):
    """A thread id no store accepts (see :data:`THREAD_ID_RULE`); nothing was read or written.

    ``field`` names the argument (``thread_id``, or ``prefix`` for :meth:`list_threads`),
    ``problem`` says what is wrong with it.
    """

    def __init__(self, value: object, problem: str, *, field: str = "thread_id") -> None:
        self.value = value
        self.problem = problem
        self.field = field
        shown = _shown(value) if isinstance(value, str) else repr(value)
        allowed = THREAD_ID_RULE if field == "thread_id" else _PREFIX_RULE
        super().__init__(f"{field}={shown} is invalid ({problem}): allowed {allowed}")


def check_thread_id(thread_id: object, *, field: str = "thread_id") -> str:
    """``thread_id`` if every store accepts it, else :class:`InvalidThreadId` (a ValueError).

    The one check of thread ids, run by every backend before it touches storage, so an id
    one store takes is taken by all (:data:`THREAD_ID_RULE`). With ``field="prefix"`` it
    checks a :meth:`ThreadStore.list_threads` prefix, which may be empty.
    """
    if not isinstance(thread_id, str):
        raise InvalidThreadId(thread_id, f"a {type(thread_id).__name__}, not a str", field=field)
    if not thread_id and field == "thread_id":
        raise InvalidThreadId(thread_id, "empty", field=field)
    if len(thread_id) > THREAD_ID_MAX_LENGTH:
        raise InvalidThreadId(thread_id, f"{len(thread_id)} characters long", field=field)
    bad = _FORBIDDEN_IN_IDS.search(thread_id)
    if bad is not None:
        char = ord(bad.group())
        kind = "a lone surrogate" if 0xD800 <= char <= 0xDFFF else "a control character"
        raise InvalidThreadId(thread_id, f"{kind} U+{char:04X} at index {bad.start()}", field=field)
    return thread_id


class Unchanged:
    """The type of :data:`UNCHANGED`: "leave this part of the thread as it is"."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __bool__(self) -> Literal[False]:
        return False


UNCHANGED: Final = Unchanged()


def _documents_tuple(value: Iterable[str]) -> tuple[str, ...]:
    """attrs converter with a concrete type (``converter=tuple`` types as ``Iterable[T_co]``)."""
    return value if type(value) is tuple else tuple(value)


@frozen
class Lease:
    """A worker's claim on one thread until ``expires_at`` (seconds since the epoch).

    ``token`` is a fencing token: strictly increasing across every lease a store grants,
    so a write carrying an older token than the thread's newest lease is refused.
    """

    thread_id: str
    owner: str
    token: int
    expires_at: float


@frozen
class Compaction:
    """Replace the live messages ``[start, end)`` with ``replacement``; originals are archived."""

    start: int
    end: int
    replacement: tuple[str, ...] = field(converter=_documents_tuple)


@frozen
class ThreadWrite:
    """One atomic change to a thread. The compaction applies first, then the append.

    ``checkpoint``: an encoded checkpoint to store, ``None`` to clear it, or UNCHANGED.
    ``state``: the encoded per-thread layer state, or UNCHANGED.
    ``run_id``: the run that writes it, recorded with the version (:mod:`tinyctx.versions`).
    """

    append: tuple[str, ...] = field(default=(), converter=_documents_tuple)
    compaction: Compaction | None = None
    checkpoint: str | Unchanged | None = UNCHANGED
    state: str | Unchanged = UNCHANGED
    run_id: str | None = None


@frozen
class ThreadRecord:
    """A thread as loaded: ``version`` is 0 and everything empty for a thread never written."""

    thread_id: str
    version: int
    messages: Sequence[str]
    """The message documents, in order (a backend may keep them split:
    :class:`~tinyctx.documents.SplitDocuments` reads as the same documents)."""
    checkpoint: str | None = None
    state: str | None = None
    lease: Lease | None = None
    """The newest lease granted on the thread (possibly expired), if any."""


@frozen
class ArchivedRange:
    """Originals a compaction replaced, kept for audit until the store's retention ends."""

    thread_id: str
    version: int
    """The thread version the compaction produced."""
    start: int
    end: int
    messages: tuple[str, ...]
    archived_at: float


@runtime_checkable
class ThreadStore(Protocol):
    """Pure storage for durable threads; every backend passes the same conformance suite."""

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now; an unknown thread is an empty record at version 0."""
        ...

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """Apply ``change`` atomically and return the new version (``expected_version + 1``).

        Raises :class:`StaleThreadVersion` when the thread is not at ``expected_version``,
        :class:`FencedOut` when ``lease`` is no longer the thread's newest lease, and
        ``ValueError`` for a compaction range outside the live log. Nothing is applied then.
        """
        ...

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """A new lease with a fresh token; :class:`LeaseHeld` while another owner's is live.

        The same owner acquiring again gets a new lease (a new token) at once.
        """
        ...

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend ``lease`` (same token); :class:`FencedOut` if another lease replaced it."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the thread up; a no-op when ``lease`` was already replaced or released."""
        ...

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        """Thread ids in sorted order, optionally those starting with ``prefix``."""
        ...

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        """What compactions replaced on ``thread_id``, oldest first, within retention."""
        ...

    async def delete_thread(self, thread_id: str) -> bool:
        """Remove the thread, its archive, checkpoint, state and lease; False if unknown."""
        ...

    async def aclose(self) -> None: ...


class StaleThreadVersion(TinyCtxError):
    """A write against a version the thread has moved past (another writer got there first)."""

    def __init__(self, thread_id: str, expected: int, actual: int) -> None:
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"thread {thread_id!r} is at version {actual}, the write expected {expected}: "
            "another writer changed it; reload the thread and retry"
        )


class LeaseHeld(SessionBusy):
    """Another worker holds the thread's lease; a second Session on it is refused."""

    def __init__(self, thread_id: str, owner: str, expires_at: float) -> None:
        self.thread_id = thread_id
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(
            f"thread {thread_id!r} is busy: leased by {owner!r} until {_when(expires_at)}"
        )


def _when(expires_at: float) -> str:
    """An expiry for a message: the UTC time and how far it is from now (this clock)."""
    try:
        moment = datetime.fromtimestamp(expires_at, UTC)
    except (OverflowError, OSError, ValueError):
        return f"{expires_at!r} (seconds since the epoch)"
    stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    left = expires_at - time.time()
    return f"{stamp} (in {left:.1f} s)" if left >= 0 else f"{stamp} ({-left:.1f} s ago)"


class FencedOut(TinyCtxError):
    """A write or renewal under a lease that a newer lease has replaced; nothing was applied."""

    def __init__(self, thread_id: str, token: int, current: int | None) -> None:
        self.thread_id = thread_id
        self.token = token
        self.current = current
        newer = "no lease" if current is None else f"lease token {current}"
        super().__init__(
            f"thread {thread_id!r}: lease token {token} was fenced out ({newer} is current); "
            "this worker lost the thread and must not write to it"
        )


def check_write_range(thread_id: str, change: ThreadWrite, length: int) -> None:
    """The shared check every backend runs before applying a compaction."""
    compaction = change.compaction
    if compaction is None:
        return
    if not 0 <= compaction.start <= compaction.end <= length:
        raise ValueError(
            f"thread {thread_id!r}: compaction range [{compaction.start}, {compaction.end}) "
            f"is outside the live log of {length} messages"
        )


def _documents(value: tuple[object, ...], what: str) -> None:
    for index, doc in enumerate(value):
        if type(doc) is not str:
            raise TypeError(
                f"{what}[{index}] must be an encoded document (str), got {type(doc).__name__}"
            )


def validate_write(
    thread_id: str, change: ThreadWrite, expected_version: int, lease: Lease | None
) -> None:
    """The argument checks every backend runs before touching storage (nothing applied yet).

    ``TypeError`` for a value of the wrong type (a document that is not a ``str``),
    ``ValueError`` for a value out of range (an empty thread id, a negative version, a
    lease of another thread).
    """
    check_thread_id(thread_id)
    if not isinstance(change, ThreadWrite):
        raise TypeError(f"change must be a ThreadWrite, got {type(change).__name__}")
    if isinstance(expected_version, bool) or not isinstance(expected_version, int):
        raise TypeError(f"expected_version must be an int, got {expected_version!r}")
    if expected_version < 0:
        raise ValueError(f"expected_version must be >= 0, got {expected_version}")
    if lease is not None:
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease or None, got {type(lease).__name__}")
        if lease.thread_id != thread_id:
            raise ValueError(
                f"the lease is for thread {lease.thread_id!r}, the write is for {thread_id!r}"
            )
    _documents(change.append, "append")
    compaction = change.compaction
    if compaction is not None:
        if not isinstance(compaction, Compaction):
            raise TypeError(f"compaction must be a Compaction, got {type(compaction).__name__}")
        for name in ("start", "end"):
            bound = getattr(compaction, name)
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise TypeError(f"compaction.{name} must be an int, got {bound!r}")
        _documents(compaction.replacement, "compaction.replacement")
    checkpoint = change.checkpoint
    if not (checkpoint is None or checkpoint is UNCHANGED or type(checkpoint) is str):
        raise TypeError(
            f"checkpoint must be an encoded document (str), None or UNCHANGED, "
            f"got {type(checkpoint).__name__}"
        )
    if not (change.state is UNCHANGED or type(change.state) is str):
        raise TypeError(
            "state must be an encoded document (str) or UNCHANGED, "
            f"got {type(change.state).__name__}"
        )


def validate_lease_request(thread_id: str, owner: str, ttl: float) -> None:
    """The argument checks of ``acquire_lease``/``renew_lease`` (``ValueError`` naming it)."""
    check_thread_id(thread_id)
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"owner must be a non-empty string, got {owner!r}")
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or ttl <= 0
    ):
        raise ValueError(f"ttl must be a finite number of seconds > 0, got {ttl!r}")
