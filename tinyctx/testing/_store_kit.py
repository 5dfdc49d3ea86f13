"""What the store conformance suites share: the factory a backend's suite provides, fresh
thread ids, an opened store, and the base every thread-store suite mixes in (the
``make_store`` fixture and the peer a concurrency case opens)."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, settings

from .. import codec
from ..messages import UserMessage

__all__ = [
    "StoreFactory",
    "ThreadSuite",
    "fresh_id",
    "opened",
    "PROPERTY",
    "STORE_EXAMPLES_ENV",
    "store_property_settings",
    "docs_of",
    "texts_of",
]


class StoreFactory(Protocol):
    """``await make_store(archive_retention=..., ttl=...)``: a new store object for one
    test (``ttl``: the store's thread TTL, for a store that keeps one)."""

    def __call__(
        self, *, archive_retention: float | None = None, ttl: float | None = None
    ) -> Awaitable[Any]: ...


_ids = itertools.count()


def fresh_id(prefix: str = "t") -> str:
    """A thread id no other test or example uses (stores of one test may share data)."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"


STORE_EXAMPLES_ENV = "TINYCTX_STORE_EXAMPLES"
"""How many examples each store property draws, when set (else the hypothesis profile's):
each example writes real threads, so a quick run can draw fewer and a deep run more."""


def store_property_settings() -> settings:
    """The settings of the store properties: one factory per test function serves many
    hypothesis examples (fresh ids isolate them); ``$TINYCTX_STORE_EXAMPLES`` sets their
    count, read when the suite is imported."""
    raw = os.environ.get(STORE_EXAMPLES_ENV, "").strip()
    if not raw:
        return settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${STORE_EXAMPLES_ENV} must be a positive integer, got {raw!r}")
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=int(raw)
    )


PROPERTY = store_property_settings()


@asynccontextmanager
async def opened(make_store: StoreFactory, **options: Any) -> AsyncIterator[Any]:
    """A store from ``make_store``, closed on the way out."""
    store = await make_store(**options)
    try:
        yield store
    finally:
        await store.aclose()


def docs_of(*texts: str) -> tuple[str, ...]:
    """User messages of ``texts``, encoded as a store holds them."""
    return codec.encode_messages(UserMessage(text) for text in texts)


def texts_of(docs: tuple[str, ...]) -> list[str]:
    """The texts of encoded messages (what a case compares)."""
    return [m.text for m in codec.decode_messages(docs)]


class ThreadSuite:
    """The base of every thread-store case class: the fixture a backend overrides and
    the second store object a concurrency case opens."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Override: an async factory of the backend's stores (see the module docstring)."""
        raise NotImplementedError("a conformance subclass must override the make_store fixture")

    async def open_peer(self, store: Any) -> Any:
        """Override: a second store object on ``store``'s data (another connection)."""
        return store

    async def close_peer(self, store: Any, peer: Any) -> None:
        """Close what :meth:`open_peer` opened (nothing when it was ``store`` itself)."""
        if peer is not store:
            await peer.aclose()
