"""The Redis key layout's version: the check on open and the move from layout 1.

Layout 2 (the current one) names every key ``<prefix>{<kind>}<name>``; layout 1 named them
``<prefix><kind>:<name>``, where one prefix nested in another could name the other's keys.
The version lives in ``<prefix>schema`` in both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..store_errors import StoreSchemaError

if TYPE_CHECKING:
    import redis

__all__ = ["SCHEMA_VERSION", "check_layout", "migrate_v1"]

SCHEMA_VERSION = 2
"""The key layout version :class:`~tinyctx.backends.redis.RedisStore` writes; an older or
newer one is refused on open (version 1 can be moved over with
:meth:`~tinyctx.backends.redis.RedisStore.migrate_layout`)."""


def check_layout(prefix: str, stored: int) -> None:
    """:class:`StoreSchemaError` unless the prefix holds the current key layout."""
    if stored > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"Redis prefix {prefix!r}: layout version {stored} was written by a newer "
            f"tinyctx (this one reads up to version {SCHEMA_VERSION})"
        )
    if stored < SCHEMA_VERSION:
        raise StoreSchemaError(
            f"Redis prefix {prefix!r} holds key layout version {stored}, written by an older "
            f"tinyctx, which this one does not read (version 1 let nested prefixes name each "
            f"other's keys); stop every worker of the prefix, then run "
            f"`await RedisStore(url, prefix={prefix!r}).migrate_layout()` once"
        )


GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def migrate_v1(url: str, timeout: float, prefix: str, key: Callable[[str, str], str]) -> int:
    """Rename a version 1 prefix's keys to the current layout (a client of its own, in the
    calling thread); how many moved."""
    import redis

    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=timeout)
    try:
        return _migrate(client, prefix, key)
    finally:
        client.close()


def _migrate(client: redis.Redis, prefix: str, key: Callable[[str, str], str]) -> int:
    """Each step is safe to repeat, and the layout version is set last, so a migration
    that stopped half way is finished by running it again."""
    marker = prefix + "schema"
    stored = client.get(marker)
    if stored is None or int(stored) >= SCHEMA_VERSION:
        return 0
    moved = 0

    def rename(old: str, new: str) -> None:
        nonlocal moved
        if client.exists(old):
            client.rename(old, new)
            moved += 1

    for thread_id in cast(list[str], client.zrange(prefix + "threads", 0, -1)):
        for kind in ("t", "m", "a", "l"):
            rename(f"{prefix}{kind}:{thread_id}", key(kind, str(thread_id)))
    for kind in ("kv", "n"):
        start = f"{prefix}{kind}:"
        for old in list(client.scan_iter(match=start.translate(GLOB_SPECIAL) + "*")):
            rename(str(old), key(kind, str(old)[len(start) :]))
    rename(prefix + "threads", key("threads", ""))
    rename(prefix + "fencing", key("fencing", ""))
    client.set(marker, SCHEMA_VERSION)
    return moved
