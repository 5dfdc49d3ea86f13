"""The PostgreSQL store's connections: what an error from the driver means (a dropped
connection, a refused login), where a URL points, and how to stop a connection's wait."""

from __future__ import annotations

import math
import os
import re
import socket
from typing import Any

from ..store_errors import StoreAuthenticationFailed

try:
    import psycopg
    import psycopg_pool
    from psycopg import conninfo as _conninfo
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

__all__ = ["dropped", "login_refused", "where", "shut_down", "reason"]


def dropped(exc: BaseException) -> bool:
    """Whether ``exc`` says the server closed the connection (not a query's own error):
    the connection failed or was shut down by an administrator (a restart, a failover)."""
    if _MISSING is not None:  # pragma: no cover - no psycopg, no store
        return False
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return False
    return isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.ConnectionFailure) or (
        type(exc) is psycopg.OperationalError and "connection" in str(exc).lower()
    )


_LOGIN_REFUSED = re.compile(
    r"authentication failed|role \"[^\n]*\" does not exist|no pg_hba\.conf entry|"
    r"no password supplied"
)


def login_refused(exc: psycopg.OperationalError) -> StoreAuthenticationFailed | None:
    """The error naming user, host and port when ``exc`` is a login the server refused;
    None for any other failure to connect."""
    text = str(exc)
    if not _LOGIN_REFUSED.search(text):
        return None
    pgconn = getattr(exc, "pgconn", None)

    def part(name: str) -> str:
        raw = getattr(pgconn, name, None) if pgconn is not None else None
        return raw.decode(errors="replace") if isinstance(raw, bytes) else "?"

    reason = text.rpartition("FATAL:")[2].strip() or text
    return StoreAuthenticationFailed(
        f"PostgreSQL at {part('host')}:{part('port')} refused the login of user "
        f"{part('user')!r} (authentication failed: {reason}); check the user, password "
        "and database in the store's URL"
    )


def where(url: str, timeout: float) -> tuple[str, float]:
    """The server's ``host:port`` (for messages: never a password) and the connect
    timeout: the URL's ``connect_timeout`` when it sets a positive one, else ``timeout``."""
    params = _conninfo.conninfo_to_dict(url)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    address = f"{host}:{params.get('port') or 5432}"
    try:
        given = float(params.get("connect_timeout") or 0)
    except ValueError:
        given = 0.0
    return address, given if given > 0 and math.isfinite(given) else timeout


def shut_down(conn: psycopg.Connection[Any]) -> None:
    """End whatever ``conn`` waits for: its socket is shut down (not closed: the driver
    still owns the descriptor), so the wait fails at once and the pool drops it."""
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def reason(exc: BaseException, password: object) -> str:
    """The driver's message, one line, without the password should it appear in it."""
    text = " ".join(str(exc).split())
    if isinstance(password, str) and password:
        text = text.replace(password, "***")
    return text
