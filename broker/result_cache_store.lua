-- Store an answer, keep the cache within its entry budget (least recently used out first),
-- and release the single-flight claim if the caller still holds it.
-- ARGV[1] key  ARGV[2] body  ARGV[3] ttl (s)  ARGV[4] now (ms)  ARGV[5] max entries
-- ARGV[6] LRU sorted set  ARGV[7] leader id ('' = none)
local lru = ARGV[6]
redis.call('SET', ARGV[1], ARGV[2], 'EX', ARGV[3])
redis.call('ZADD', lru, ARGV[4], ARGV[1])
-- entries older than the TTL have expired on their own
redis.call('ZREMRANGEBYSCORE', lru, '-inf', tonumber(ARGV[4]) - tonumber(ARGV[3]) * 1000)
local over = redis.call('ZCARD', lru) - tonumber(ARGV[5])
if over > 0 then
  for i, old in ipairs(redis.call("ZPOPMIN", lru, over)) do
    -- ZPOPMIN returns member, score pairs; members are the odd entries
    if i % 2 == 1 then redis.call("DEL", old) end
  end
end
if ARGV[7] ~= '' then
  local sf = ARGV[1] .. ':sf'
  if redis.call('GET', sf) == ARGV[7] then redis.call('DEL', sf) end
end
return 1
