-- Write cache entries and keep the cache within its entry budget: each entry with its TTL, its
-- recency (last write or hit) in a sorted set; past the budget the least recently used go first.
-- KEYS[1] recency index (sorted set)
-- ARGV[1] ttl s, ARGV[2] now ms, ARGV[3] max entries, ARGV[4] n entries written,
-- ARGV[5 .. 4+2n] key, value pairs; the ARGV after them: keys of hits (TTL and recency refreshed).
-- Returns how many entries were evicted.
local ttl, now, max, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 0, n - 1 do
  redis.call("SET", ARGV[5 + 2 * i], ARGV[6 + 2 * i], "EX", ttl)
  redis.call("ZADD", KEYS[1], now, ARGV[5 + 2 * i])
end
for i = 5 + 2 * n, #ARGV do
  if redis.call("EXPIRE", ARGV[i], ttl) == 1 then
    redis.call("ZADD", KEYS[1], "XX", now, ARGV[i])
  end
end
-- entries older than the TTL have expired on their own
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - ttl * 1000)
local evicted = 0
local over = redis.call("ZCARD", KEYS[1]) - max
if over > 0 then
  local oldest = redis.call("ZPOPMIN", KEYS[1], over)
  for i = 1, #oldest, 2 do -- member, score pairs
    redis.call("DEL", oldest[i])
    evicted = evicted + 1
  end
end
redis.call("EXPIRE", KEYS[1], ttl)
return evicted
