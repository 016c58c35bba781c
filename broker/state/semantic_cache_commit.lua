-- Make a semantic cache miss an entry of its scope, now that its answer is in the result cache,
-- and keep each scope and the whole cache within their entry budgets.
-- ARGV[1] pending hash (written by the retrieval worker: scope, q, v)   ARGV[2] scope
-- ARGV[3] the scope's stream   ARGV[4] the answer's result cache key
-- ARGV[5] entries per scope    ARGV[6] entries in all   ARGV[7] scopes sorted set (stream -> ms)
-- ARGV[8] sizes hash (stream -> entries)   ARGV[9] total (string)   ARGV[10] ttl (s)   ARGV[11] now (ms)
-- Returns 1 when the entry was added, 0 when nothing was pending for this scope.
-- Not allow-oom: on a full Redis it is refused, as every cache write is.
local pending, scope, stream = ARGV[1], ARGV[2], ARGV[3]
local per_scope, max_total = tonumber(ARGV[5]), tonumber(ARGV[6])
local scopes, sizes, total_key = ARGV[7], ARGV[8], ARGV[9]
local ttl, now = tonumber(ARGV[10]), tonumber(ARGV[11])

local found = redis.call('HMGET', pending, 'scope', 'q', 'v')
if found[1] ~= scope or not found[2] or not found[3] then
  redis.call('DEL', pending)
  return 0
end
redis.call('XADD', stream, 'MAXLEN', per_scope, '*', 'q', found[2], 'v', found[3], 'k', ARGV[4])
redis.call('DEL', pending)
redis.call('EXPIRE', stream, ttl)

local total = tonumber(redis.call('GET', total_key)) or 0
local function forget(member, delete)
  total = total - (tonumber(redis.call('HGET', sizes, member)) or 0)
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', scopes, member)
  if delete then redis.call('DEL', member) end
end
-- Scopes not written for a TTL have expired on their own (a bounded look per commit).
for _, member in ipairs(redis.call('ZRANGEBYSCORE', scopes, '-inf', now - ttl * 1000, 'LIMIT', 0, 100)) do
  forget(member, false)
end
local size = redis.call('XLEN', stream)
total = total - (tonumber(redis.call('HGET', sizes, stream)) or 0) + size
redis.call('HSET', sizes, stream, size)
-- Strictly after the last write, so that two in one millisecond keep their order.
local newest = redis.call('ZRANGE', scopes, -1, -1, 'WITHSCORES')[2]
redis.call('ZADD', scopes, math.max(now, (tonumber(newest) or 0) + 0.001), stream)
-- Past the total, whole scopes go, least recently written first (never the one just written).
while total > max_total and redis.call('ZCARD', scopes) > 1 do
  local oldest = redis.call('ZRANGE', scopes, 0, 0)[1]
  forget(oldest, true)
end
if total < 0 then total = 0 end
redis.call('SET', total_key, total, 'EX', ttl)
redis.call('EXPIRE', scopes, ttl)
redis.call('EXPIRE', sizes, ttl)
return 1
