-- Store an answer, keep the cache within its entry and byte budgets (least recently used out
-- first), and release the single-flight claim if the caller still holds it.
-- ARGV[1] key  ARGV[2] body  ARGV[3] ttl (s)  ARGV[4] now (ms)  ARGV[5] max entries
-- ARGV[6] LRU sorted set  ARGV[7] leader id ('' = none)  ARGV[8] max bytes
-- ARGV[9] sizes hash (entry -> bytes)  ARGV[10] bytes total (string)
-- An entry's bytes are its key's and its body's: Redis' own overhead per entry (~200 bytes,
-- bounded by the entry budget) is not counted.
-- Returns 1 when stored, 0 when the answer alone is over the byte budget (not stored).
local key, lru, sizes, total_key = ARGV[1], ARGV[6], ARGV[9], ARGV[10]
local ttl, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_entries, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[8])

local function release()
  if ARGV[7] ~= '' then
    local sf = key .. ':sf'
    if redis.call('GET', sf) == ARGV[7] then redis.call('DEL', sf) end
  end
end

local size = #key + #ARGV[2]
if size > max_bytes then
  release()
  return 0
end

local total = tonumber(redis.call('GET', total_key)) or 0
-- Drop entries from the index and the total; `delete`: their keys too (evicted, not expired).
local function forget(members, delete)
  for _, m in ipairs(members) do
    total = total - (tonumber(redis.call('HGET', sizes, m)) or 0)
    redis.call('HDEL', sizes, m)
    redis.call('ZREM', lru, m)
    if delete then redis.call('DEL', m) end
  end
end

-- The first write: on a full Redis it is refused before anything changed (a script may write
-- past maxmemory once it has written, so nothing that writes may come before it).
local rewritten = tonumber(redis.call('HGET', sizes, key)) or 0
redis.call('SET', key, ARGV[2], 'EX', ttl)
redis.call('ZADD', lru, now, key)
redis.call('HSET', sizes, key, size)
total = total - rewritten + size
-- Entries older than the TTL have expired on their own (a bounded look per store).
forget(redis.call('ZRANGEBYSCORE', lru, '-inf', now - ttl * 1000, 'LIMIT', 0, 1000), false)
local over = redis.call('ZCARD', lru) - max_entries
while over > 0 or total > max_bytes do
  local oldest = redis.call('ZRANGE', lru, 0, math.max(over, 1) - 1)
  if #oldest == 0 then break end
  forget(oldest, true)
  over = over - #oldest
end
if total < 0 then total = 0 end
redis.call('SET', total_key, total, 'EX', ttl)
redis.call('EXPIRE', lru, ttl)
redis.call('EXPIRE', sizes, ttl)
release()
return 1
