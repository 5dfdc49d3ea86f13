"""What the networked backends share: blocking driver calls in worker threads, lazy open
and close, argument checks, and the install hint for a missing extra."""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Generic, Self, TypeVar
from urllib.parse import unquote_plus

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..config import integer, number
from ..store_errors import StoreClosed, StoreUnavailable
from ..store_protocols import Note
from ..worker import keep_inherited, reset_after_fork

T = TypeVar("T")
C = TypeVar("C")

__all__ = [
    "CallAbandoned",
    "NetworkedStore",
    "WorkerThreads",
    "cancelled",
    "stoppable",
    "missing_extra",
    "redact_url",
    "check_positive",
]


def missing_extra(owner: str, packages: str, extra: str, cause: BaseException) -> ImportError:
    """The error for a store whose driver is not installed: names the command that fixes it."""
    error = ImportError(
        f"{owner} needs {packages}, which are not installed: pip install 'tinyctx[{extra}]'"
    )
    error.__cause__ = cause
    return error


_SECRET_WORDS = ("pass", "secret", "token")
_HIDDEN = "***"


def _secret(name: str) -> bool:
    """Whether a connection option of this name holds a secret (``password``,
    ``sslpassword``, ``passfile``... : anything naming a password, a secret or a token)."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def redact_url(url: object) -> str:
    """``url`` without its secrets, for reprs, error messages and events.

    Every form a driver reads a password from is covered: the ``user:password@`` of a URL,
    a URL's query options (``?password=``, ``&sslpassword=``, percent-encoded names too)
    and a libpq ``key=value`` string (``host=db password='s e'``); each secret becomes
    ``***``. Text it cannot parse is cut where the parse failed.
    """
    if not isinstance(url, str):
        return "<not a str>"
    scheme, sep, rest = url.partition("://")
    if sep and scheme and all(c.isalnum() or c in "+.-" for c in scheme):
        return scheme + sep + _redact_uri_body(rest)
    return _redact_key_values(url)


def _redact_uri_body(rest: str) -> str:
    """What follows ``scheme://``: the userinfo's password and secret query options. The
    userinfo is taken to run to the last ``@`` before the query, a superset of what any
    driver reads (an unencoded ``/`` or ``#`` in a password is hidden too)."""
    query_at = rest.find("?")
    head, tail = (rest, "") if query_at < 0 else (rest[:query_at], rest[query_at:])
    userinfo, at, hosts = head.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        head = f"{user}:{_HIDDEN}@{hosts}" if colon else head
    if not tail:
        return head
    query, hash_, fragment = tail[1:].partition("#")
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}={_HIDDEN}" if equals and _secret(unquote_plus(name)) else pair)
    return head + "?" + "&".join(pairs) + hash_ + (_HIDDEN if fragment else "")


def _redact_key_values(text: str) -> str:
    """A libpq ``key=value`` string with each secret value replaced (libpq's own grammar:
    a value is single-quoted with backslash escapes, or runs to the next whitespace)."""
    out: list[str] = []
    at, size = 0, len(text)
    while at < size:
        start = at
        while at < size and text[at].isspace():
            at += 1
        name_start = at
        while at < size and not text[at].isspace() and text[at] != "=":
            at += 1
        name = text[name_start:at]
        while at < size and text[at].isspace():
            at += 1
        if not name or at >= size or text[at] != "=":
            if text[start:].strip():
                out.append(" <unparsable>")
            break
        at += 1
        while at < size and text[at].isspace():
            at += 1
        value_start = at
        at = _value_end(text, at)
        value = text[value_start:at] if at >= 0 else text[value_start:]
        shown = _HIDDEN if _secret(name) else value
        out.append(text[start:value_start] + shown)
        if at < 0:
            out.append(" <unparsable>")
            break
    return "".join(out)


def _value_end(text: str, at: int) -> int:
    """Where a libpq value starting at ``at`` ends; -1 for an unterminated quote."""
    size = len(text)
    if at < size and text[at] == "'":
        at += 1
        while at < size and text[at] != "'":
            at += 2 if text[at] == "\\" else 1
        return at + 1 if at < size else -1
    while at < size and not text[at].isspace():
        at += 2 if text[at] == "\\" else 1
    return min(at, size)


_COUNT: Final = integer(minimum=1)
_SECONDS: Final = number(above=0, allowed="a finite number of seconds > 0")


def check_positive(owner: str, name: str, value: object, *, integer: bool = False) -> None:
    """A ConfigError naming ``owner.name`` unless ``value`` is a number > 0 (an int when
    ``integer``): the config validators, for the networked stores' sizes and timeouts."""
    (_COUNT if integer else _SECONDS).check(value, name, owner)


class _Call:
    """One driver call in a worker thread: whether its caller gave up on it, and how to
    stop what it is waiting for meanwhile (see :func:`stoppable`); for a call with an undo,
    whether its thread began it, its result once handed back, and when it is done."""

    __slots__ = ("_lock", "_stop", "_stopped", "cancelled", "finished", "kept", "started")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None
        self._stopped = False
        self.cancelled = False
        self.started = False
        self.kept: tuple[Any] | None = None
        self.finished = threading.Event()

    def cancel(self) -> None:
        with self._lock:  # the call cannot leave its stoppable block meanwhile
            self.cancelled = True
            if self._stop is not None:
                self._stopped = True
                with contextlib.suppress(Exception):
                    self._stop()

    def begin(self) -> bool:
        """In the thread: start the call unless its caller has given up already."""
        with self._lock:
            self.started = not self.cancelled
            return self.started

    def hand_back(self, result: Any) -> bool:
        """In the thread: keep ``result`` for the caller; False once it has given up (the
        thread undoes it then)."""
        with self._lock:
            if self.cancelled:
                return False
            self.kept = (result,)
            return True


_current = threading.local()


# how long a caller that gave up on a call with an undo waits for the call to be settled
# (a server that cannot answer in that time would stall the next request as well; the
# undo still runs in the call's thread once the server answers)
_SETTLE_BOUND: Final = 1.0


class CallAbandoned(Exception):
    """Raised in a worker thread for a call whose caller was cancelled before it sent
    anything (nobody sees it: its caller has left)."""


@contextlib.contextmanager
def stoppable(stop: Callable[[], None], discard: Callable[[], None]) -> Iterator[None]:
    """In a worker thread, around one wait on one connection: if the call's caller is
    cancelled meanwhile, ``stop()`` is called (from the event loop's thread) to end the
    wait (a socket shut down: the driver fails the call) rather than leave the thread,
    and the connection, waiting on a server that may never answer; ``discard()`` then
    runs in the thread on leaving the block (the connection closed, so the pool drops it
    even when the call had ended before the stop). A caller that had already given up gets
    :class:`CallAbandoned` here, before anything is sent. ``stop`` runs only inside the
    block, so it never touches a connection handed back to the pool."""
    call: _Call | None = getattr(_current, "call", None)
    if call is None:
        yield
        return
    with call._lock:
        if call.cancelled:
            raise CallAbandoned
        call._stop = stop
    try:
        yield
    finally:
        with call._lock:
            call._stop = None
            stopped, call._stopped = call._stopped, False
        if stopped:
            discard()


def cancelled() -> bool:
    """In a worker thread: whether the running call's caller was cancelled (a call that
    would try again, on a fresh connection, gives up instead)."""
    call: _Call | None = getattr(_current, "call", None)
    return call is not None and call.cancelled


class WorkerThreads(Generic[C]):
    """Blocking driver calls in worker threads, at most ``capacity`` at once.

    The drivers' async clients are asyncio-only (psycopg's ``AsyncConnection``, redis-py's
    ``redis.asyncio``), so a store that must serve trio and asyncio alike uses their sync
    clients here: waiting callers queue on the event loop (a ``CapacityLimiter`` per loop),
    never in (nor exhausting) anyio's shared thread pool.

    Every call answers a cancellation at once: the caller leaves (its deadline holds),
    and the driver call, left in its thread, is stopped where the store marks its wait
    :func:`stoppable` (its connection's socket shut down, the connection dropped), else
    ends when the server answers or the driver's own timeout ends it. A semaphore held by
    the thread, not the caller, keeps the calls really in flight at ``capacity`` (the
    pool's size), so an abandoned call never makes the pool run short. What such a call
    did is unknown to the caller: a write whose caller was cancelled may have landed (the
    session's write bound reports it as :class:`~tinyctx.stores.WriteOutcomeUnknown`). A
    call with an ``undo`` is never stopped: it is waited out in its thread, then undone, and
    its caller leaves only once that is done (shielded, bounded by a second): a lease
    request cancelled on its way leaves no lease for the next request to find.

    ``connect`` builds the client on first use, in a worker thread, bounded by
    ``connect_timeout`` seconds on the event loop: past it the call fails with
    :class:`~tinyctx.stores.StoreUnavailable` naming ``address``; ``disconnect`` closes
    it on :meth:`aclose`, after which every call raises :class:`StoreClosed`.
    """

    def __init__(
        self,
        describe: Callable[[], str],
        capacity: int,
        connect: Callable[[], C],
        disconnect: Callable[[C], None],
        *,
        connect_timeout: float,
        address: str,
    ) -> None:
        self._describe = describe
        self._capacity = capacity
        self._connect = connect
        self._disconnect = disconnect
        self.connect_timeout = connect_timeout
        self.address = address
        self._client: C | None = None
        self._lock = threading.Lock()
        self._permits = threading.BoundedSemaphore(capacity)
        self._closed = False
        self._limiter: tuple[object, anyio.CapacityLimiter] | None = None
        reset_after_fork(self)

    @property
    def state(self) -> str:
        return "closed" if self._closed else "open" if self._client is not None else "unopened"

    def _loop_limiter(self) -> anyio.CapacityLimiter:
        token = anyio.lowlevel.current_token()
        cached = self._limiter
        if cached is None or cached[0] != token:
            cached = self._limiter = (token, anyio.CapacityLimiter(self._capacity))
        return cached[1]

    def client(self) -> C:
        """The open client (connecting on first use); call from a worker thread."""
        client = self._client
        if client is not None and not self._closed:
            return client
        with self._lock:
            if self._closed:
                raise StoreClosed(f"{self._describe()} was closed")
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _after_fork(self) -> None:
        """In a child process (a store opened before a pre-forking server forked): the
        parent's client talks over the parent's sockets, so the child connects anew. The
        inherited one is left alone, never closed: closing it would end the parent's
        sessions (psycopg's own finalizer knows not to in a child)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._permits = threading.BoundedSemaphore(self._capacity)
        self._limiter = None
        if self._client is not None:
            keep_inherited(self._client)
            self._client = None

    async def run(
        self, fn: Callable[..., T], *args: Any, undo: Callable[[C, T], object] | None = None
    ) -> T:
        """``fn(client, *args)`` in a worker thread; a cancellation is answered at once.

        ``undo(client, result)`` runs when the caller was cancelled before the call
        finished (a lease nobody will hold: released at once, not left to expire), before
        the caller leaves (see :meth:`_settle`).
        """
        if self._client is None and not self._closed:
            await self._open()
        permits = self._permits
        state = _Call()

        def call() -> T:
            with permits:
                # a call with an undo is waited out, never stopped: the undo needs to
                # know what it did (a lease granted is released)
                _current.call = state if undo is None else None
                try:
                    if undo is not None and not state.begin():
                        raise CallAbandoned  # its caller left before it began
                    client = self.client()
                    result = fn(client, *args)
                    if undo is not None and not state.hand_back(result):
                        undo(client, result)
                    return result
                finally:
                    _current.call = None
                    state.finished.set()

        try:
            return await anyio.to_thread.run_sync(
                call, limiter=self._loop_limiter(), abandon_on_cancel=True
            )
        except BaseException:
            state.cancel()
            if undo is not None:
                await self._settle(state, undo)
            raise

    async def _settle(self, state: _Call, undo: Callable[[C, Any], object]) -> None:
        """The caller of a call with an undo gave up on it: wait until its thread is done
        with it (shielded, bounded by ``_SETTLE_BOUND``), so that what it did is undone
        before the caller leaves (the next request finds no lease of it), and undo here
        a result handed back as the caller gave up (the event loop dropped it). A call
        its thread had not begun never begins."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_BOUND):
            if not state.started:
                return
            if not state.finished.is_set():
                await anyio.to_thread.run_sync(
                    state.finished.wait, _SETTLE_BOUND, abandon_on_cancel=True
                )
            if state.kept is not None:
                (result,) = state.kept
                with contextlib.suppress(Exception):  # the caller's own error is raised
                    await self.run(lambda client: undo(client, result))

    async def _open(self) -> None:
        """Connect, bounded by the connect timeout (a server that accepts and never
        answers, or drops every packet, fails here rather than holding the caller)."""
        with anyio.move_on_after(self.connect_timeout) as scope:
            await anyio.to_thread.run_sync(
                self.client, limiter=self._loop_limiter(), abandon_on_cancel=True
            )
        if scope.cancelled_caught:
            raise StoreUnavailable(
                f"{self._describe()}: no connection to {self.address} within the connect "
                f"timeout of {self.connect_timeout:g}s",
                address=self.address,
            )

    async def aclose(self) -> None:
        """Close the client; later calls raise :class:`StoreClosed`. Idempotent."""

        def close() -> None:
            with self._lock:
                self._closed = True
                client, self._client = self._client, None
            if client is not None:
                self._disconnect(client)

        await anyio.to_thread.run_sync(close, limiter=self._loop_limiter())


class NetworkedStore(ABC):
    """What both networked stores share: lifecycle, and single notes as one-note batches."""

    _threads: WorkerThreads[Any]

    @abstractmethod
    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Note]: ...

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        (note,) = await self.append_notes(namespace, (text,), metadata=metadata)
        return note

    async def open(self) -> None:
        """Connect (and create or check the schema) now, instead of on first use."""
        await self._threads.run(lambda client: None)

    async def aclose(self) -> None:
        """Close the connections; later calls raise :class:`~tinyctx.stores.StoreClosed`."""
        await self._threads.aclose()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
