"""RedisStore: Store and ThreadStore on Redis, for many workers sharing one Redis.

Needs the ``redis`` extra (redis-py): ``pip install 'tinyctx[redis]'``.

Keys (layout version 2; every key is ``prefix`` then ``{kind}`` then a name, ``prefix``
being ``tinyctx:`` unless ``prefix=`` says otherwise):

- ``{kv}<namespace>`` a hash of JSON values; ``{n}<namespace>`` a list of notes (a note's
  ``seq`` is its position + 1: notes are append-only);
- ``{t}<thread>`` a hash: version, checkpoint, state, and the newest lease (token, owner,
  expiry, the id of the request that got it); ``{m}<thread>`` the live messages (a list);
  ``{a}<thread>`` the archive; ``{l}<thread>`` the live lease, ``SET ... PX ttl`` so Redis
  expires it; ``{threads}`` the sorted index of thread ids; ``{fencing}`` the
  fencing-token counter; and ``schema`` (no brace) the layout version;
- ``{h}<thread>`` the checkpoint and layer state each write set (``load_as_of``);
  ``{lb}<thread>`` the thread's labels (``tinyctx.thread_metadata``); ``{nn}<thread>`` the
  set of its ``...:thread:<thread>`` note namespaces; ``{x}<thread>`` the index entry of
  an expiring thread and ``{expiring}`` the mark that the prefix has any (thread expiry:
  :mod:`tinyctx.backends._redis_expiry`); ``{g}<thread>`` the lease requests given up on
  (a sorted set of request ids by when Redis may forget them; see
  :meth:`RedisStore.acquire_lease`).

A prefix holds no ``{``, so no (prefix, kind, name) names another's key, nested prefixes
(``acme:``, ``acme:m:``) included, and ``SCAN MATCH <prefix>{*`` lists one store's keys.
Layout 1 is refused on open; :meth:`RedisStore.migrate_layout` moves it over.

Every change to a thread is one Lua script, so the fencing check (the thread's newest lease
token), the version check and the write are atomic: a worker whose lease another worker has
taken over cannot write, and nothing it sent is half applied. Lease expiry is Redis's own
(``PX``) and expiry times are Redis's clock (``TIME``). One Redis (or its primary) holds a
store: the scripts touch a thread's keys and the global counter together, which a Redis
Cluster would spread over slots.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.to_thread

from ..config import Check
from ..errors import ConfigError
from ..lifecycle import THREAD_METADATA, check_store_ttl, thread_of_namespace
from ..store_errors import StoreClosed, StoreUnavailable
from ..store_protocols import (
    Note,
    check_archive_retention,
    check_fence,
    check_lease,
    check_notes_limit,
    encode_json,
    note_texts,
)
from ..threads import (
    ArchivedRange,
    FencedOut,
    Lease,
    LeaseHeld,
    StaleThreadVersion,
    ThreadRecord,
    ThreadWrite,
    Unchanged,
    check_thread_id,
    check_write_range,
    validate_lease_request,
    validate_write,
)
from ._common import (
    NetworkedStore,
    WorkerThreads,
    check_positive,
    missing_extra,
    redact_url,
)
from ._redis_client import Client, where
from ._redis_expiry import RedisExpiry, ttl_arg
from ._redis_layout import SCHEMA_VERSION, check_layout, migrate_v1
from ._redis_lifecycle import RedisLifecycle

try:
    import redis
    import redis.backoff
    import redis.connection
    import redis.retry
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

__all__ = ["RedisStore", "SCHEMA_VERSION"]


_SCHEMES = ("redis://", "rediss://", "unix://")
# how long a lease request given up on waits for Redis to settle it (one small script):
# a Redis that cannot answer it in that time would stall the next request as well, and the
# worker thread still releases a grant that lands later (WorkerThreads.run's undo)
_GIVE_UP_BOUND: Final = 1.0


def _ttl_ms(thread_id: str, owner: str, ttl: float) -> int:
    validate_lease_request(thread_id, owner, ttl)
    return max(1, math.ceil(ttl * 1000))


def _check_str(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    return value


_PREFIX: Final[Check[str]] = Check(
    lambda value: isinstance(value, str) and bool(value) and "{" not in value,
    "a non-empty str without '{' (it ends each prefix)",
)


class RedisStore(RedisExpiry, RedisLifecycle, NetworkedStore):
    """:class:`~tinyctx.stores.Store` and :class:`~tinyctx.threads.ThreadStore` on Redis.

    ``url`` is a redis-py URL: ``redis://[:password@]host:6379/0``, ``rediss://`` (TLS) or
    ``unix:///path/redis.sock``. Options:

    - ``prefix``: the start of every key this store uses (any text without ``{``);
      applications or tenants that must not see each other use different prefixes, which
      may nest (``acme:`` and ``acme:eu:`` never see each other's keys);
    - ``max_connections``: the client's connection pool, and calls in flight at once per
      event loop;
    - ``timeout``: the connect timeout in seconds when the URL sets no
      ``socket_connect_timeout`` (the URL's wins): a server that refuses, or does not
      answer the first command within it, fails with
      :class:`~tinyctx.stores.StoreUnavailable` naming the host and port;
    - ``archive_retention``: seconds compacted-away originals stay readable through
      :meth:`archived`; None keeps them until the thread is deleted;
    - ``ttl``: seconds a thread lives after its last write (None: forever; a thread's own
      TTL, :func:`~tinyctx.retention.set_thread_ttl`, wins), by Redis's own key expiry:
      nothing of an expired thread is left, without a sweep (Redis 7.0 or newer).

    Calls run on redis-py's sync client in worker threads (``redis.asyncio`` is asyncio-only),
    so the store serves trio and asyncio alike; each answers a cancellation at once (see
    :class:`~tinyctx.backends._common.WorkerThreads`), but a lease request, which first gives
    itself up on Redis (shielded, bounded by a second; see :meth:`acquire_lease`). Use a
    Redis with persistence (AOF) for data that must survive a restart of Redis itself.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "tinyctx:",
        max_connections: int = 8,
        timeout: float = 30.0,
        archive_retention: float | None = None,
        ttl: float | None = None,
    ) -> None:
        owner = "RedisStore"
        if _MISSING is not None:
            raise missing_extra(owner, "redis-py", "redis", _MISSING)
        if not isinstance(url, str) or not url.startswith(_SCHEMES):
            shown = redact_url(url) if isinstance(url, str) else url
            raise ConfigError(
                "url", shown, "a Redis URL: redis://, rediss:// or unix://", owner=owner
            )
        _PREFIX.check(prefix, "prefix", owner)
        check_positive(owner, "max_connections", max_connections, integer=True)
        check_positive(owner, "timeout", timeout)
        self.url = url
        self.prefix = prefix
        self.max_connections = max_connections
        self.timeout = float(timeout)
        self.archive_retention = check_archive_retention(archive_retention, owner)
        self.ttl = check_store_ttl(ttl, owner)
        self.address, self.connect_timeout = where(url, self.timeout)
        self._threads: WorkerThreads[Client] = WorkerThreads(
            self.__repr__,
            max_connections,
            self._connect,
            lambda client: client.redis.close(),
            connect_timeout=self.connect_timeout,
            address=self.address,
        )

    def __repr__(self) -> str:
        state = self._threads.state
        return f"<RedisStore {redact_url(self.url)} prefix={self.prefix!r} {state}>"

    # -- plumbing ------------------------------------------------------------------------

    def _connect(self) -> Client:
        # the layout check on a client of its own whose every read is bounded by the
        # connect timeout: a server that accepts and never answers fails here, in time,
        # instead of holding this thread (and the connect lock) for good
        probe = redis.Redis.from_url(
            self.url,
            decode_responses=True,
            socket_connect_timeout=self.connect_timeout,
            socket_timeout=self.connect_timeout,
            retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
        )
        try:
            key = self.prefix + "schema"
            probe.set(key, SCHEMA_VERSION, nx=True)
            stored = int(probe.get(key) or 0)
        except redis.TimeoutError as exc:
            raise StoreUnavailable(
                f"{self!r}: no answer from Redis at {self.address} within the connect "
                f"timeout of {self.connect_timeout:g}s",
                address=self.address,
            ) from exc
        except redis.ConnectionError as exc:
            raise StoreUnavailable(
                f"{self!r}: Redis at {self.address} is unavailable: {exc}", address=self.address
            ) from exc
        finally:
            probe.close()
        check_layout(self.prefix, stored)
        return Client(self.url, self.max_connections, self.connect_timeout)

    def _key(self, kind: str, name: str = "") -> str:
        """The key of ``name`` of ``kind``: ``<prefix>{<kind>}<name>``."""
        return f"{self.prefix}{{{kind}}}{name}"

    def _thread_keys(self, thread_id: str) -> tuple[str, str, str, str]:
        return (
            self._key("t", thread_id),
            self._key("m", thread_id),
            self._key("a", thread_id),
            self._key("l", thread_id),
        )

    # -- lifecycle -----------------------------------------------------------------------

    async def schema_version(self) -> int:
        """The key layout version stored under the prefix."""
        raw = await self._threads.run(lambda client: client.redis.get(self.prefix + "schema"))
        return int(raw or 0)

    async def migrate_layout(self) -> int:
        """Move this prefix's data from key layout version 1 to the current one; how many
        keys moved. Run it once, with every worker of the prefix stopped (their leases are
        moved too). A prefix already at the current layout is left as it is (0).
        Key/value and note keys are found by ``SCAN MATCH <prefix>kv:*`` / ``<prefix>n:*``
        (layout 1 listed no namespaces): migrate a prefix nested in this one first.
        """
        # its own client: the store's refuses to open a version 1 prefix
        url, timeout = self.url, self.timeout
        return await anyio.to_thread.run_sync(migrate_v1, url, timeout, self.prefix, self._key)

    # -- key/value -----------------------------------------------------------------------

    async def get(self, namespace: str, key: str) -> Any | None:
        name = self._key("kv", _check_str("namespace", namespace))
        field = _check_str("key", key)
        if namespace == THREAD_METADATA:  # a key per thread, expiring with it
            return await self._get_label(field)
        raw = await self._threads.run(lambda client: client.redis.hget(name, field))
        return None if raw is None else json.loads(raw)

    async def put(self, namespace: str, key: str, value: Any) -> None:
        name = self._key("kv", _check_str("namespace", namespace))
        field = _check_str("key", key)
        if namespace == THREAD_METADATA:
            await self._put_label(field, value)
            return
        encoded = encode_json(value, f"the value of {namespace!r}/{key!r}", owner="RedisStore")
        await self._threads.run(lambda client: client.redis.hset(name, field, encoded))

    async def delete(self, namespace: str, key: str) -> bool:
        name = self._key("kv", _check_str("namespace", namespace))
        field = _check_str("key", key)
        if namespace == THREAD_METADATA:
            return await self._delete_label(field)
        return bool(await self._threads.run(lambda client: client.redis.hdel(name, field)))

    async def keys(self, namespace: str) -> list[str]:
        name = self._key("kv", _check_str("namespace", namespace))
        if namespace == THREAD_METADATA:
            return await self._label_keys()
        fields = await self._threads.run(lambda client: client.redis.hkeys(name))
        return sorted(fields)

    # -- notes ---------------------------------------------------------------------------

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> list[Note]:
        """Append every text with consecutive ``seq`` values: one ``RPUSH``, atomic; with
        ``fence``, one Lua script that first checks it is its thread's newest lease (as a
        thread write does), else :class:`FencedOut` with nothing written."""
        items = note_texts(texts)
        name = self._key("n", _check_str("namespace", namespace))
        check_fence(fence)
        if not items:
            return []
        meta = encode_json(metadata or {}, "note metadata", owner="RedisStore")
        now = time.time()
        entries = [_note_entry(now, meta, text) for text in items]
        if thread_of_namespace(namespace) is not None:  # listed with its thread, to expire
            token = None if fence is None else fence.token
            outcome, figure = await self._append_thread_notes(namespace, entries, token)
            if outcome != "ok":
                assert fence is not None
                raise FencedOut(fence.thread_id, fence.token, int(figure) if figure else None)
            length = int(figure)
        elif fence is None:
            length = int(await self._threads.run(lambda client: client.redis.rpush(name, *entries)))
        else:
            thread = self._thread_keys(fence.thread_id)[0]
            outcome, figure = await self._threads.run(
                lambda client: client.fenced_append(
                    keys=[thread, name], args=[fence.token, *entries]
                )
            )
            if outcome != "ok":
                raise FencedOut(fence.thread_id, fence.token, int(figure) if figure else None)
            length = int(figure)
        first = length - len(items) + 1
        decoded = json.loads(meta)
        return [Note(namespace, first + i, text, now, decoded) for i, text in enumerate(items)]

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        """Notes in ``seq`` order; with ``limit``, only the newest ``limit`` of them."""
        check_notes_limit(limit)
        name = self._key("n", _check_str("namespace", namespace))
        if limit == 0:
            return []

        def read(client: Client) -> tuple[int, list[str]]:
            with client.redis.pipeline(transaction=True) as pipe:
                pipe.llen(name)
                pipe.lrange(name, -limit if limit else 0, -1)
                length, entries = pipe.execute()
            return int(length), entries

        length, entries = await self._threads.run(read)
        first = length - len(entries) + 1
        return [_note_from_entry(namespace, first + i, raw) for i, raw in enumerate(entries)]

    async def delete_notes(self, namespace: str) -> int:
        """Remove every note of ``namespace`` (its ``seq`` starts at 1 again); how many."""
        name = self._key("n", _check_str("namespace", namespace))

        def delete(client: Client) -> int:
            with client.redis.pipeline(transaction=True) as pipe:
                pipe.llen(name)
                pipe.delete(name)
                length, _ = pipe.execute()
            return int(length)

        return await self._threads.run(delete)

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        """The thread now, read in one ``MULTI`` (one consistent snapshot)."""
        thread, messages, _, _ = self._thread_keys(check_thread_id(thread_id))

        def read(client: Client) -> tuple[list[str | None], list[str]]:
            with client.redis.pipeline(transaction=True) as pipe:
                pipe.hmget(thread, ["v", "cp", "st", "lt", "lo", "le"])
                pipe.lrange(messages, 0, -1)
                fields, docs = pipe.execute()
            return fields, docs

        fields, docs = await self._threads.run(read)
        version, checkpoint, state, token, owner, expires = fields
        lease = None
        if token is not None:
            lease = Lease(thread_id, str(owner), int(token), int(expires or 0) / 1000)
        return ThreadRecord(thread_id, int(version or 0), tuple(docs), checkpoint, state, lease)

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        """Apply ``change`` in one Lua script: fencing, version and range checks first."""
        validate_write(thread_id, change, expected_version, lease)
        thread, messages, archive, _ = self._thread_keys(thread_id)
        now = time.time()
        keep_after = "" if self.archive_retention is None else repr(now - self.archive_retention)
        checkpoint, state, compaction = change.checkpoint, change.state, change.compaction
        args: list[str | int] = [
            thread_id,
            expected_version,
            "" if lease is None else lease.token,
            repr(now),
            keep_after,
            "u" if isinstance(checkpoint, Unchanged) else "c" if checkpoint is None else "s",
            checkpoint if isinstance(checkpoint, str) else "",
            "u" if isinstance(state, Unchanged) else "s",
            state if isinstance(state, str) else "",
        ]
        if compaction is None:
            args += ["", "", 0]
        else:
            replacement = compaction.replacement
            args += [compaction.start, compaction.end, len(replacement), *replacement]
        args += change.append
        args += [change.run_id or "", ttl_arg(self.ttl)]
        keys = [thread, messages, archive, self._key("threads")]
        outcome, figure = await self._threads.run(lambda client: client.write(keys=keys, args=args))
        if outcome == "ok":
            return int(figure)
        if outcome == "fenced":
            assert lease is not None
            raise FencedOut(thread_id, lease.token, int(figure) if figure else None)
        if outcome == "stale":
            raise StaleThreadVersion(thread_id, expected_version, int(figure))
        check_write_range(thread_id, change, int(figure))
        raise AssertionError(f"write script returned {outcome!r}")  # pragma: no cover

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Lease ``thread_id`` to ``owner`` for ``ttl`` seconds (``LeaseHeld`` if another
        owner holds it).

        A caller that gives up on the request (cancelled, or the connection lost) does not
        leave before Redis has settled it: one more bounded, shielded script gives up the
        request by the id it was sent with, so whether the grant had landed, is still on its
        way (in its worker thread, or retried by redis-py) or never will, no lease of it is
        live once the caller has left (the next request finds the thread free).
        """
        ttl_ms = _ttl_ms(thread_id, owner, ttl)
        thread, _, _, live = self._thread_keys(check_thread_id(thread_id))
        given_up = self._key("g", thread_id)
        request = os.urandom(8).hex()
        keys = [thread, live, self._key("fencing"), given_up]
        args = [_check_str("owner", owner), ttl_ms, request]

        def release(client: Client, answer: Any) -> None:  # its caller was cancelled
            if answer[0]:
                client.release(keys=keys[:2], args=[answer[3]])

        try:
            granted, holder, expires, token = await self._threads.run(
                lambda client: client.acquire(keys=keys, args=args), undo=release
            )
        except (StoreUnavailable, StoreClosed):
            raise  # no connection: nothing was sent
        except BaseException:
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(min(ttl, _GIVE_UP_BOUND)),
                contextlib.suppress(Exception),  # the error that ended the request is raised
            ):
                await self._threads.run(
                    lambda client: client.abandon(
                        keys=[thread, live, given_up], args=[request, ttl_ms]
                    )
                )
            raise
        if not granted:
            raise LeaseHeld(thread_id, holder, int(expires) / 1000)
        return Lease(thread_id, owner, int(token), int(expires) / 1000)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl_ms = _ttl_ms(lease.thread_id, lease.owner, ttl)
        thread, _, _, live = self._thread_keys(check_lease(lease, "renew_lease").thread_id)
        renewed, figure = await self._threads.run(
            lambda client: client.renew(keys=[thread, live], args=[lease.token, ttl_ms])
        )
        if not renewed:
            raise FencedOut(lease.thread_id, lease.token, int(figure) if figure else None)
        return Lease(lease.thread_id, lease.owner, lease.token, int(figure) / 1000)

    async def release_lease(self, lease: Lease) -> None:
        thread, _, _, live = self._thread_keys(check_lease(lease, "release_lease").thread_id)
        await self._threads.run(
            lambda client: client.release(keys=[thread, live], args=[lease.token])
        )

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        check_notes_limit(limit)
        check_thread_id(prefix, field="prefix")
        if limit == 0:
            return []
        index = self._key("threads")
        low = "[" + prefix if prefix else "-"
        # every id starting with `prefix` sorts below prefix + U+10FFFF... in bytes; 0xFF
        # never occurs in UTF-8, so prefix bytes + 0xFF is a strict upper bound
        high: str | bytes = ("(" + prefix).encode() + b"\xff" if prefix else "+"

        def read(client: Client) -> list[str]:
            if limit is None:
                return client.redis.zrangebylex(index, low, high)  # type: ignore[return-value]
            return client.redis.zrangebylex(  # type: ignore[return-value]
                index, low, high, start=0, num=limit
            )

        listed = await self._threads.run(read)
        expiring = await self._expiring_threads(prefix)
        if not expiring:
            return listed
        # the index's first `limit` and every expiring one hold the first `limit` of all
        ids = sorted({*listed, *expiring}, key=lambda tid: tid.encode())
        return ids if limit is None else ids[:limit]

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        _, _, archive, _ = self._thread_keys(check_thread_id(thread_id))
        entries: list[str] = await self._threads.run(
            lambda client: client.redis.lrange(archive, 0, -1)
        )
        keep_after = (
            None if self.archive_retention is None else time.time() - self.archive_retention
        )
        ranges: list[ArchivedRange] = []
        at = 0
        while at < len(entries):
            version, start, end, archived_at, count = entries[at].split(" ")
            originals = tuple(entries[at + 1 : at + 1 + int(count)])
            at += 1 + int(count)
            if keep_after is not None and float(archived_at) < keep_after:
                continue
            ranges.append(
                ArchivedRange(
                    thread_id, int(version), int(start), int(end), originals, float(archived_at)
                )
            )
        return ranges

    async def delete_thread(self, thread_id: str) -> bool:
        keys = [*self._thread_keys(check_thread_id(thread_id)), self._key("threads")]
        existed = await self._threads.run(lambda client: client.delete(keys=keys, args=[thread_id]))
        return bool(existed)


def _note_entry(created_at: float, metadata: str, text: str) -> str:
    return f"[{created_at!r},{metadata},{json.dumps(text, ensure_ascii=False)}]"


def _note_from_entry(namespace: str, seq: int, raw: str) -> Note:
    created_at, metadata, text = json.loads(raw)
    return Note(namespace, seq, text, float(created_at), metadata)
