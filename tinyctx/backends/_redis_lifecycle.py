"""The thread-lifecycle capabilities of :class:`~tinyctx.backends.redis.RedisStore`.

A mixin of the store (kept apart from its connection and write paths): each method is a
new Lua script over the store's own keys, run through the store's worker threads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..lifecycle import ThreadWindow, check_age, check_window_args
from ..threads import check_thread_id
from ..versions import ThreadVersion

if TYPE_CHECKING:
    from ._common import WorkerThreads
    from ._redis_client import Client

__all__ = ["RedisLifecycle"]

# KEYS: thread, messages; ARGV: stop or '', count
# -> {length, start, version or '', has checkpoint, checkpoint, has state, state, docs}
_WINDOW = """
local length = redis.call('LLEN', KEYS[2])
local stop = length
if ARGV[1] ~= '' then stop = math.min(tonumber(ARGV[1]), length) end
local start = math.max(stop - tonumber(ARGV[2]), 0)
local docs = {}
if stop > start then docs = redis.call('LRANGE', KEYS[2], start, stop - 1) end
local f = redis.call('HMGET', KEYS[1], 'v', 'cp', 'st')
return {length, start, f[1] or '', f[2] and 1 or 0, f[2] or '', f[3] and 1 or 0, f[3] or '',
        docs}
"""

# KEYS: archive; ARGV: keep-after (seconds) -> how many ranges were removed
_PRUNE = """
local removed = 0
while true do
    local header = redis.call('LINDEX', KEYS[1], 0)
    if not header then break end
    local fields = {}
    for field in string.gmatch(header, '%S+') do fields[#fields + 1] = field end
    if tonumber(fields[4]) >= tonumber(ARGV[1]) then break end
    redis.call('LTRIM', KEYS[1], tonumber(fields[5]) + 1, -1)
    removed = removed + 1
end
return removed
"""


# KEYS: history; ARGV: version -> {checkpoint found, checkpoint, state found, state}: the
# newest kept at or before the version
_LAYERS = """
local checkpoint, state = nil, nil
local at = tonumber(ARGV[1])
while at > 0 and (checkpoint == nil or state == nil) do
    if checkpoint == nil then checkpoint = redis.call('HGET', KEYS[1], 'c' .. at) or nil end
    if state == nil then state = redis.call('HGET', KEYS[1], 's' .. at) or nil end
    at = at - 1
end
return {checkpoint and 1 or 0, checkpoint or '', state and 1 or 0, state or ''}
"""


class RedisLifecycle:
    """:class:`~tinyctx.lifecycle.ThreadWindowStore` on Redis."""

    if TYPE_CHECKING:  # RedisStore's
        _threads: WorkerThreads[Client]

        def _thread_keys(self, thread_id: str) -> tuple[str, str, str, str]: ...

        def _key(self, kind: str, name: str = "") -> str: ...

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` live messages before ``stop``, in one script (one
        snapshot); see :meth:`tinyctx.lifecycle.ThreadWindowStore.load_window`."""
        check_window_args(thread_id, stop, count)
        thread, messages, _, _ = self._thread_keys(thread_id)
        args = ["" if stop is None else str(stop), str(count)]

        def read(client: Client) -> Any:
            script = client.redis.register_script(_WINDOW)
            return script(keys=[thread, messages], args=args)

        length, start, version, has_cp, checkpoint, has_st, state, docs = await self._threads.run(
            read
        )
        return ThreadWindow(
            thread_id,
            int(version or 0),
            int(length),
            int(start),
            tuple(docs),
            checkpoint if has_cp else None,
            state if has_st else None,
        )

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        """What each write did, oldest first (a ``w<version>`` field of the thread's hash
        per write); see :mod:`tinyctx.versions`."""
        thread = self._thread_keys(check_thread_id(thread_id))[0]

        def read(client: Client) -> dict[str, str]:
            fields: dict[str, str] = client.redis.hgetall(thread)  # type: ignore[assignment]
            return fields

        out = []
        for name, value in (await self._threads.run(read)).items():
            if not (name.startswith("w") and name[1:].isdigit()):
                continue
            at, appended, start, end, replaced, *run = value.split(",", 5)
            out.append(
                ThreadVersion(
                    int(name[1:]),
                    float(at),
                    int(appended),
                    int(start) if start else None,
                    int(end) if end else None,
                    int(replaced),
                    run[0] if run and run[0] else None,
                )
            )
        out.sort(key=lambda v: v.version)
        return out

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        """The checkpoint and state the thread had at ``version`` (a ``{h}<thread>`` hash
        keeps what each write set), in one script; see
        :class:`tinyctx.versions.ThreadLayersStore`."""
        history = self._key("h", check_thread_id(thread_id))

        def read(client: Client) -> Any:
            script = client.redis.register_script(_LAYERS)
            return script(keys=[history], args=[str(version)])

        has_cp, checkpoint, has_state, state = await self._threads.run(read)
        kept = checkpoint[1:] if has_cp and checkpoint.startswith("+") else None
        return kept, (state if has_state else None)

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Drop archived ranges older than ``older_than`` seconds, in one script."""
        archive = self._thread_keys(check_thread_id(thread_id))[2]
        keep_after = repr(time.time() - check_age(older_than))

        def prune(client: Client) -> int:
            return int(client.redis.register_script(_PRUNE)(keys=[archive], args=[keep_after]))

        return await self._threads.run(prune)
