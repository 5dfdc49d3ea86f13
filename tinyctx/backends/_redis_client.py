"""The Redis store's client: redis-py with a connection pool whose waits a cancelled
caller can stop, and the store's scripts registered once."""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import Callable
from typing import Any

from ._common import CallAbandoned, cancelled, stoppable
from ._redis_scripts import ABANDON, ACQUIRE, DELETE, FENCED_APPEND, RELEASE, RENEW, WRITE

try:
    import redis
    import redis.connection
except ImportError:  # pragma: no cover - the store names the extra to install
    pass

__all__ = ["Client", "where"]


def where(url: str, timeout: float) -> tuple[str, float]:
    """The server's ``host:port`` (or socket path; never a password) and the connect
    timeout: the URL's ``socket_connect_timeout`` when it sets one, else ``timeout``."""
    try:
        options = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        options = {}
    address = str(options.get("path") or "")
    if not address:
        address = f"{options.get('host') or 'localhost'}:{options.get('port') or 6379}"
    given = options.get("socket_connect_timeout")
    if isinstance(given, float) and given > 0 and math.isfinite(given):
        return address, given
    return address, timeout


def _stoppable_pool() -> type[Any]:
    """redis-py's ConnectionPool, whose connections a cancelled caller can stop
    (:func:`~tinyctx.backends._common.stoppable`): the socket of the connection its call
    waits on is shut down, redis-py's retry does not reconnect for it, and the connection
    is dropped when it comes back. Built on first use (redis-py is an optional extra)."""

    class StoppablePool(redis.ConnectionPool):
        def make_connection(self) -> Any:
            connection: Any = super().make_connection()
            connect: Callable[[], None] = connection.connect

            def guarded() -> None:
                if cancelled():  # nobody waits for this call: no (re)connecting for it
                    raise CallAbandoned
                connect()

            connection.connect = guarded
            return connection

        def get_connection(self, *args: Any, **options: Any) -> Any:
            connection: Any = super().get_connection(*args, **options)
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(
                    stoppable(lambda: _shut_down(connection), connection.disconnect)
                )
            except BaseException:
                super().release(connection)
                raise
            connection._tinyctx_stop = stack
            return connection

        def release(self, connection: Any) -> None:
            stack = connection.__dict__.pop("_tinyctx_stop", None)
            try:
                if stack is not None:
                    stack.close()
            finally:
                super().release(connection)

    return StoppablePool


def _shut_down(connection: Any) -> None:
    sock = connection._sock
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)


class Client:
    """The redis-py client and the registered scripts (one per store)."""

    pool_class: type[Any] | None = None

    def __init__(self, url: str, max_connections: int, timeout: float) -> None:
        if Client.pool_class is None:
            Client.pool_class = _stoppable_pool()
        pool = Client.pool_class.from_url(
            url,
            decode_responses=True,
            max_connections=max_connections,
            socket_connect_timeout=timeout,
            health_check_interval=30,
        )
        self.redis: redis.Redis = redis.Redis(connection_pool=pool)
        self.redis.auto_close_connection_pool = True
        self.write = self.redis.register_script(WRITE)
        self.acquire = self.redis.register_script(ACQUIRE)
        self.abandon = self.redis.register_script(ABANDON)
        self.renew = self.redis.register_script(RENEW)
        self.release = self.redis.register_script(RELEASE)
        self.delete = self.redis.register_script(DELETE)
        self.fenced_append = self.redis.register_script(FENCED_APPEND)
