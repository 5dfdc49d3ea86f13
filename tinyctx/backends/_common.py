"""What the networked backends share: blocking driver calls in worker threads, lazy open
and close, argument checks, and the install hint for a missing extra."""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..errors import ConfigError
from ..stores import Note, StoreClosed
from ..worker import keep_inherited, reset_after_fork

T = TypeVar("T")
C = TypeVar("C")

__all__ = [
    "NetworkedStore",
    "WorkerThreads",
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


def redact_url(url: str) -> str:
    """``url`` without its password, for reprs and error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def check_positive(owner: str, name: str, value: object, *, integer: bool = False) -> None:
    """A ConfigError unless ``value`` is a number > 0 (an int when ``integer``)."""
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not value > 0  # type: ignore[operator]
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        allowed = "an integer >= 1" if integer else "a finite number of seconds > 0"
        raise ConfigError(name, value, allowed, owner=owner)


class WorkerThreads(Generic[C]):
    """Blocking driver calls in worker threads, at most ``capacity`` at once per event loop.

    The drivers' async clients are asyncio-only (psycopg's ``AsyncConnection``, redis-py's
    ``redis.asyncio``), so a store that must serve trio and asyncio alike uses their sync
    clients here: waiting callers queue on the event loop (a ``CapacityLimiter`` per loop),
    never in (nor exhausting) anyio's shared thread pool. A cancelled caller waits for its
    call to finish (the database applies a statement whole or not at all, so there is no
    half-done write to abandon) and then sees the cancellation.

    ``connect`` builds the client on first use, in a worker thread; ``disconnect`` closes it
    on :meth:`aclose`, after which every call raises :class:`StoreClosed`.
    """

    def __init__(
        self,
        describe: Callable[[], str],
        capacity: int,
        connect: Callable[[], C],
        disconnect: Callable[[C], None],
    ) -> None:
        self._describe = describe
        self._capacity = capacity
        self._connect = connect
        self._disconnect = disconnect
        self._client: C | None = None
        self._lock = threading.Lock()
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
        self._limiter = None
        if self._client is not None:
            keep_inherited(self._client)
            self._client = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(client, *args)`` in a worker thread."""

        def call() -> T:
            return fn(self.client(), *args)

        return await anyio.to_thread.run_sync(call, limiter=self._loop_limiter())

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
