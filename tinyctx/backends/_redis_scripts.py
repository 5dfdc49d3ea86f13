"""The Redis store's Lua scripts: each change to a thread is one script, so the fencing
check, the version check and the write are atomic on the server."""

from __future__ import annotations

from ._redis_expiry import EXPIRY

__all__ = [
    "LUA_PUSH",
    "WRITE",
    "NOW_MS",
    "ACQUIRE",
    "ABANDON",
    "RENEW",
    "RELEASE",
    "DELETE",
    "FENCED_APPEND",
]

# pushes ARGV[from..to] (or a table's items) onto a list in chunks: unpack() has a limit
LUA_PUSH = """
local function push_args(key, first, last)
    local i = first
    while i <= last do
        local j = math.min(i + 999, last)
        redis.call('RPUSH', key, unpack(ARGV, i, j))
        i = j + 1
    end
end
local function push_table(key, items)
    local i = 1
    while i <= #items do
        local j = math.min(i + 999, #items)
        redis.call('RPUSH', key, unpack(items, i, j))
        i = j + 1
    end
end
"""

# KEYS: thread, messages, archive, index
# ARGV: thread id, expected version, lease token or '', now, keep-after or '',
#       checkpoint mode (u/s/c), checkpoint, state mode (u/s), state,
#       compaction start or '', end, replacement count, replacement..., appended...,
#       then the write's run id or '', and last the store's thread TTL in ms or ''
#       (tinyctx.backends._redis_expiry)
WRITE = (
    LUA_PUSH
    + EXPIRY
    + """
local thread, messages, archive, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if ARGV[3] ~= '' then
    local current = redis.call('HGET', thread, 'lt')
    if current ~= ARGV[3] then return {'fenced', current or ''} end
end
local version = tonumber(redis.call('HGET', thread, 'v') or '0')
if version ~= tonumber(ARGV[2]) then return {'stale', tostring(version)} end
local length = redis.call('LLEN', messages)
local new = version + 1
local next_arg = 13
if ARGV[10] ~= '' then
    local s, e, n = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
    if not (0 <= s and s <= e and e <= length) then return {'range', tostring(length)} end
    local originals = {}
    if e > s then originals = redis.call('LRANGE', messages, s, e - 1) end
    local tail = {}
    if e < length then tail = redis.call('LRANGE', messages, e, -1) end
    if s == 0 then redis.call('DEL', messages) else redis.call('LTRIM', messages, 0, s - 1) end
    push_args(messages, 13, 12 + n)
    push_table(messages, tail)
    if e > s then
        local header = table.concat({new, s, e, ARGV[4], #originals}, ' ')
        redis.call('RPUSH', archive, header)
        push_table(archive, originals)
    end
    if ARGV[5] ~= '' then
        local keep_after = tonumber(ARGV[5])
        while true do
            local header = redis.call('LINDEX', archive, 0)
            if not header then break end
            local fields = {}
            for field in string.gmatch(header, '%S+') do fields[#fields + 1] = field end
            if tonumber(fields[4]) >= keep_after then break end
            redis.call('LTRIM', archive, tonumber(fields[5]) + 1, -1)
        end
    end
    next_arg = 13 + n
end
push_args(messages, next_arg, #ARGV - 2)
-- what this write did (tinyctx.versions): at, appended, start, end, replaced, run id
redis.call('HSET', thread, 'w' .. new, table.concat(
    {ARGV[4], #ARGV - next_arg - 1, ARGV[10], ARGV[11], ARGV[10] ~= '' and ARGV[12] or 0,
     ARGV[#ARGV - 1]}, ','))
redis.call('HSET', thread, 'v', new)
if ARGV[6] == 's' then redis.call('HSET', thread, 'cp', ARGV[7])
elseif ARGV[6] == 'c' then redis.call('HDEL', thread, 'cp') end
if ARGV[8] == 's' then redis.call('HSET', thread, 'st', ARGV[9]) end
redis.call('ZADD', index, 0, ARGV[1])
local prefix = string.sub(thread, 1, #thread - #ARGV[1] - 3)
-- the checkpoint and state this write set, kept for reads as of a version
local history = prefix .. '{h}' .. ARGV[1]
if ARGV[6] == 's' then redis.call('HSET', history, 'c' .. new, '+' .. ARGV[7])
elseif ARGV[6] == 'c' then redis.call('HSET', history, 'c' .. new, '-') end
if ARGV[8] == 's' then redis.call('HSET', history, 's' .. new, ARGV[9]) end
refresh(prefix, ARGV[1], ARGV[#ARGV])
return {'ok', tostring(new)}
"""
)

NOW_MS = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: thread, live lease, fencing counter, given-up requests; ARGV: owner, ttl ms,
# request id (chosen by the client; refused once ABANDON named it)
ACQUIRE = (
    NOW_MS
    + """
local given_up = redis.call('ZSCORE', KEYS[4], ARGV[3])
if given_up and tonumber(given_up) > now_ms then return {0, '', '0', ''} end
if redis.call('EXISTS', KEYS[2]) == 1 then
    local holder = redis.call('HGET', KEYS[1], 'lo')
    if holder ~= ARGV[1] then
        return {0, holder or '', redis.call('HGET', KEYS[1], 'le') or '0', ''}
    end
end
local token = redis.call('INCR', KEYS[3])
local expires = now_ms + tonumber(ARGV[2])
redis.call('SET', KEYS[2], token, 'PX', ARGV[2])
local left = redis.call('PTTL', KEYS[1])  -- an expiring thread's lease goes with it
if left > 0 then redis.call('PEXPIRE', KEYS[2], left, 'LT') end
redis.call('HSET', KEYS[1], 'lt', token, 'lo', ARGV[1], 'le', expires, 'lr', ARGV[3])
return {1, ARGV[1], tostring(expires), tostring(token)}
"""
)

# KEYS: thread, live lease, given-up requests; ARGV: request id, ttl ms. The caller of
# the ACQUIRE of that id gave up on it (cancelled, or its reply lost): what it was granted
# is released, and should it arrive later (still in a worker thread, or retried by the
# driver) it is refused for the next ttl ms. Returns 1 when it had been granted.
ABANDON = (
    NOW_MS
    + """
local granted = redis.call('HGET', KEYS[1], 'lr') == ARGV[1]
if granted then
    redis.call('DEL', KEYS[2])
    redis.call('HDEL', KEYS[1], 'lt', 'lo', 'le', 'lr')
end
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
redis.call('ZADD', KEYS[3], now_ms + ttl, ARGV[1])
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
return granted and 1 or 0
"""
)

# KEYS: thread, live lease; ARGV: token, ttl ms
RENEW = (
    NOW_MS
    + """
local current = redis.call('HGET', KEYS[1], 'lt')
if current ~= ARGV[1] then return {0, current or ''} end
local expires = now_ms + tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then redis.call('PEXPIRE', KEYS[2], left, 'LT') end
redis.call('HSET', KEYS[1], 'le', expires)
return {1, tostring(expires)}
"""
)

# KEYS: thread, live lease; ARGV: token
RELEASE = """
if redis.call('HGET', KEYS[1], 'lt') == ARGV[1] then
    redis.call('DEL', KEYS[2])
    redis.call('HDEL', KEYS[1], 'lt', 'lo', 'le', 'lr')
end
return 0
"""

# KEYS: thread, messages, archive, live lease, index; ARGV: thread id
DELETE = """
local existed = redis.call('EXISTS', KEYS[1])  -- written, or leased
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1] - 3)
-- its layer copies, its given-up lease requests, and its index entry if it was expiring
-- (tinyctx.backends._redis_expiry)
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], prefix .. '{h}' .. ARGV[1],
           prefix .. '{x}' .. ARGV[1], prefix .. '{g}' .. ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return existed
"""


# KEYS: thread, notes; ARGV: lease token, entries...
FENCED_APPEND = (
    LUA_PUSH
    + """
local current = redis.call('HGET', KEYS[1], 'lt')
if current ~= ARGV[1] then return {'fenced', current or ''} end
push_args(KEYS[2], 2, #ARGV)
return {'ok', tostring(redis.call('LLEN', KEYS[2]))}
"""
)
