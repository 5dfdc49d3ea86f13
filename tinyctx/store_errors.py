"""The errors a store raises about itself (closed, unreachable, a schema it cannot open,
a write whose outcome is unknown), shared by every backend."""

from __future__ import annotations

from .errors import TinyCtxError

__all__ = [
    "StoreError",
    "StoreSchemaError",
    "StoreClosed",
    "StoreAuthenticationFailed",
    "StoreUnavailable",
    "WriteOutcomeUnknown",
]


class StoreError(TinyCtxError):
    """Base of the errors a store raises about itself (closed, unreachable, a schema it
    cannot open, a write whose outcome is unknown)."""


class StoreSchemaError(StoreError):
    """The file is not a tinyctx store this version can open (not SQLite, or newer)."""


class StoreClosed(StoreError):
    """The store was closed with ``aclose()``."""


class StoreAuthenticationFailed(StoreError):
    """The database refused the store's login (a wrong password, an unknown user, no
    ``pg_hba.conf`` entry for it); the message names user, host and port, never the
    password. Retrying does not help: fix the URL."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store's server could not be reached, or did not answer the connection within
    the connect timeout (the URL's, else the store's ``timeout``). ``address`` names it
    (``host:port``, never a password); the driver's error, when there is one, is the
    ``__cause__``. Nothing was written."""

    def __init__(self, message: str, *, address: str = "") -> None:
        self.address = address
        super().__init__(message)


class WriteOutcomeUnknown(StoreError, TimeoutError):
    """A thread write was sent and no answer came within the write bound (the server
    stalled, or the connection broke mid-call): it may have landed or not.

    Look before you retry: open the thread again (a new ``Session`` loads what the store
    holds, which resolves it) and check whether your input is there before sending it
    again. ``thread_id`` names the thread, ``expected_version`` the version the write was
    made against (a stored version past it means the write landed) and ``seconds`` the
    bound it exceeded. Also a :class:`TimeoutError`.
    """

    def __init__(self, thread_id: str, *, expected_version: int, seconds: float) -> None:
        self.thread_id = thread_id
        self.expected_version = expected_version
        self.seconds = seconds
        super().__init__(
            f"writing thread {thread_id!r} (at version {expected_version}) got no answer "
            f"within {seconds:g}s: it may have landed or not; open the thread and look "
            "before you retry"
        )
