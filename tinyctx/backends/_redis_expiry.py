"""Thread expiry on Redis (:class:`~tinyctx.lifecycle.ThreadExpiryStore`): native.

Every key of an expiring thread carries Redis's own expiry (``PEXPIRE``), set again by
each write in the write's script, so an expired thread leaves nothing behind without any
sweep: its hash, messages, archive, lease (capped, ``PEXPIRE ... LT``), labels
(``{lb}<thread>``, a key of their own: a hash field cannot expire on Redis 7.0), the
notes of its namespaces (listed in ``{nn}<thread>``) and its index entry. Erasing a
thread (:meth:`RedisExpiry.erase_thread`) deletes the same keys in one script. An expiring
thread leaves the sorted ``{threads}`` index (a member cannot expire) for an entry
``{x}<thread>`` that expires with it; ``list_threads`` adds those (``SCAN``) once the
prefix has any (``{expiring}``, which names no thread). Needs Redis 7.0 or newer.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from ..lifecycle import THREAD_METADATA, thread_of_namespace
from ..store_protocols import encode_json
from ..threads import check_thread_id
from ._redis_layout import GLOB_SPECIAL

if TYPE_CHECKING:
    from ._common import WorkerThreads
    from ._redis_client import Client

__all__ = ["EXPIRY", "RedisExpiry", "ttl_arg"]

# thread_keys(prefix, thread id): every key of the thread that expires with it (the lease
# and index entry aside), its notes' lists included; refresh(prefix, thread id, default
# ttl ms or ''): those keys expire ttl ms from now (its own ttl field, else the default);
# a thread that stopped expiring persists
EXPIRY = """
local function thread_keys(prefix, tid)
    local listed = prefix .. '{nn}' .. tid
    local keys = {prefix .. '{t}' .. tid, prefix .. '{m}' .. tid, prefix .. '{a}' .. tid,
                  listed, prefix .. '{lb}' .. tid, prefix .. '{h}' .. tid}
    for _, ns in ipairs(redis.call('SMEMBERS', listed)) do
        keys[#keys + 1] = prefix .. '{n}' .. ns
    end
    return keys
end
local function refresh(prefix, tid, default)
    local thread = prefix .. '{t}' .. tid
    local ttl = redis.call('HGET', thread, 'ttl') or default
    local index, entry = prefix .. '{threads}', prefix .. '{x}' .. tid
    if ttl == '' or ttl == 'inf' then
        if redis.call('HDEL', thread, 'ex') == 1 then
            for _, key in ipairs(thread_keys(prefix, tid)) do redis.call('PERSIST', key) end
            redis.call('DEL', entry)
            redis.call('ZADD', index, 0, tid)
        end
        return
    end
    redis.call('HSET', thread, 'ex', '1')
    for _, key in ipairs(thread_keys(prefix, tid)) do redis.call('PEXPIRE', key, ttl) end
    redis.call('PEXPIRE', prefix .. '{l}' .. tid, ttl, 'LT')
    redis.call('ZREM', index, tid)
    redis.call('SET', entry, '1', 'PX', ttl)
    redis.call('SET', prefix .. '{expiring}', '1')
end
"""

# KEYS: old labels hash; ARGV: prefix, thread id -> how many keys and entries went: the
# keys expiry would expire, the lease and its given-up requests, the thread's index
# entries and its old-style label
_ERASE = (
    EXPIRY
    + """
local prefix, tid = ARGV[1], ARGV[2]
local keys = thread_keys(prefix, tid)
keys[#keys + 1] = prefix .. '{l}' .. tid
keys[#keys + 1] = prefix .. '{x}' .. tid
keys[#keys + 1] = prefix .. '{g}' .. tid
local found = 0
for _, key in ipairs(keys) do found = found + redis.call('DEL', key) end
found = found + redis.call('ZREM', prefix .. '{threads}', tid)
return found + redis.call('HDEL', KEYS[1], tid)
"""
)

# KEYS: thread; ARGV: prefix, thread id, own ttl ms / 'inf' / '' (none), default or ''
_SET_TTL = (
    EXPIRY
    + """
if tonumber(redis.call('HGET', KEYS[1], 'v') or '0') == 0 then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], 'ttl')
else redis.call('HSET', KEYS[1], 'ttl', ARGV[3]) end
refresh(ARGV[1], ARGV[2], ARGV[4])
return 1
"""
)

# KEYS: thread, notes, the thread's note namespaces; ARGV: lease token or '', namespace,
# entries... -> {'ok', length} or {'fenced', current token}
_THREAD_NOTES = """
if ARGV[1] ~= '' then
    local current = redis.call('HGET', KEYS[1], 'lt')
    if current ~= ARGV[1] then return {'fenced', current or ''} end
end
local length = 0
local i = 3
while i <= #ARGV do
    local j = math.min(i + 999, #ARGV)
    length = redis.call('RPUSH', KEYS[2], unpack(ARGV, i, j))
    i = j + 1
end
redis.call('SADD', KEYS[3], ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then
    redis.call('PEXPIRE', KEYS[2], left)
    redis.call('PEXPIRE', KEYS[3], left)
end
return {'ok', tostring(length)}
"""

# KEYS: label, thread, old labels hash; ARGV: thread id, value -> the label expires with
# its thread
_PUT_LABEL = """
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[1])
local left = redis.call('PTTL', KEYS[2])
if left > 0 then redis.call('PEXPIRE', KEYS[1], left) end
return 1
"""


def ttl_arg(seconds: float | None) -> str:
    """A TTL for the scripts: milliseconds, ``inf`` (never), or '' (none set)."""
    if seconds is None:
        return ""
    return "inf" if math.isinf(seconds) else str(max(1, math.ceil(seconds * 1000)))


class RedisExpiry:
    """Thread TTLs, labels and thread notes on Redis (see the module docstring)."""

    if TYPE_CHECKING:  # RedisStore's
        _threads: WorkerThreads[Client]
        prefix: str
        ttl: float | None

        def _key(self, kind: str, name: str = "") -> str: ...

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        """The thread's own TTL from now (None: the store's; ``math.inf``: never), in one
        script that sets every key's expiry again."""
        thread = self._key("t", check_thread_id(thread_id))
        args = [self.prefix, thread_id, ttl_arg(seconds), ttl_arg(self.ttl)]

        def run(client: Client) -> int:
            return int(client.redis.register_script(_SET_TTL)(keys=[thread], args=args))

        return bool(await self._threads.run(run))

    async def erase_thread(self, thread_id: str) -> bool:
        """The thread, its labels and its thread notes, in one script; see
        :class:`tinyctx.lifecycle.ThreadEraseStore`."""
        keys = [self._key("kv", THREAD_METADATA)]
        args = [self.prefix, check_thread_id(thread_id)]

        def run(client: Client) -> int:
            return int(client.redis.register_script(_ERASE)(keys=keys, args=args))

        return bool(await self._threads.run(run))

    async def sweep_expired(self) -> list[str]:
        """Nothing to do: Redis expires every key of a thread itself (empty)."""
        await self._threads.run(lambda client: None)
        return []

    async def _scan(self, kind: str, start: str = "") -> list[str]:
        """The names of this prefix's keys of ``kind`` starting with ``start``."""
        head = self._key(kind)
        pattern = (head + start).translate(GLOB_SPECIAL) + "*"

        def scan(client: Client) -> list[str]:
            return [str(k)[len(head) :] for k in client.redis.scan_iter(match=pattern, count=1000)]

        return await self._threads.run(scan)

    async def _expiring_threads(self, prefix: str) -> list[str]:
        """The expiring threads whose id starts with ``prefix`` (not in the index)."""
        marker = self._key("expiring")
        if not await self._threads.run(lambda client: client.redis.exists(marker)):
            return []
        return await self._scan("x", prefix)

    async def _append_thread_notes(
        self, namespace: str, entries: list[str], token: int | None
    ) -> tuple[str, str]:
        """Append notes of a thread's namespace: listed with the thread, expiring with it."""
        owner = thread_of_namespace(namespace)
        assert owner is not None
        keys = [self._key("t", owner), self._key("n", namespace), self._key("nn", owner)]
        args = ["" if token is None else str(token), namespace, *entries]

        def run(client: Client) -> Any:
            return client.redis.register_script(_THREAD_NOTES)(keys=keys, args=args)

        outcome, figure = await self._threads.run(run)
        return str(outcome), str(figure)

    # -- labels: THREAD_METADATA's values, one key per thread -----------------------------

    async def _get_label(self, thread_id: str) -> Any | None:
        label, old = self._key("lb", thread_id), self._key("kv", THREAD_METADATA)

        def read(client: Client) -> Any:
            raw = client.redis.get(label)
            return raw if raw is not None else client.redis.hget(old, thread_id)

        raw = await self._threads.run(read)
        return None if raw is None else json.loads(raw)

    async def _put_label(self, thread_id: str, value: Any) -> None:
        encoded = encode_json(value, f"the labels of {thread_id!r}", owner="RedisStore")
        keys = [self._key("lb", thread_id), self._key("t", thread_id)]
        keys.append(self._key("kv", THREAD_METADATA))

        def run(client: Client) -> None:
            client.redis.register_script(_PUT_LABEL)(keys=keys, args=[thread_id, encoded])

        await self._threads.run(run)

    async def _delete_label(self, thread_id: str) -> bool:
        label, old = self._key("lb", thread_id), self._key("kv", THREAD_METADATA)

        def run(client: Client) -> bool:
            with client.redis.pipeline(transaction=True) as pipe:
                pipe.delete(label)
                pipe.hdel(old, thread_id)
                gone, old_gone = pipe.execute()
            return bool(gone or old_gone)

        return await self._threads.run(run)

    async def _label_keys(self) -> list[str]:
        old = self._key("kv", THREAD_METADATA)
        fields = await self._threads.run(lambda client: client.redis.hkeys(old))
        return sorted({*await self._scan("lb"), *fields})
