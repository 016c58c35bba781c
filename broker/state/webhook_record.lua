#!lua flags=allow-oom
-- Record the outcome of delivery attempt n and, in the same step, schedule the next attempt or
-- dead-letter the delivery, so a crash cannot lose a retry or dead-letter twice.
-- KEYS[1] job hash, KEYS[2] schedule (sorted set), KEYS[3] dead-letter list
-- ARGV[1] attempt n, ARGV[2] now, ARGV[3] outcome (delivered | gone | retry | deferred),
-- ARGV[4] last-attempt JSON, ARGV[5] max attempts, ARGV[6] next attempt due (unix s),
-- ARGV[7] job id, ARGV[8] dead-letter list cap, ARGV[9] job ttl s, ARGV[10] dead-letter JSON
-- Returns stale | delivered | gone | scheduled | dead | deferred.
if redis.call("HGET", KEYS[1], "delivery_inflight") ~= ARGV[1] then
  return "stale"
end
local n = tonumber(ARGV[1])
if ARGV[3] == "deferred" then
  -- Attempt n never reached the receiver (the resolver, or this host's delivery slots, were
  -- full): it runs again at ARGV[6] and counts for nothing; the last attempt stays the last.
  redis.call("HDEL", KEYS[1], "delivery_inflight", "delivery_lease_until")
  redis.call("HSET", KEYS[1], "delivery_status", "scheduled", "delivery_next_at", ARGV[6])
  redis.call("HINCRBY", KEYS[1], "delivery_deferrals", 1)
  redis.call("ZADD", KEYS[2], ARGV[6], ARGV[7] .. ":" .. n)
  redis.call("EXPIRE", KEYS[1], ARGV[9])
  return "deferred"
end
redis.call("HSET", KEYS[1], "delivery_attempts", n, "delivery_last", ARGV[4])
redis.call("HDEL", KEYS[1], "delivery_inflight", "delivery_lease_until", "delivery_next_at")
local result
if ARGV[3] == "delivered" then
  redis.call("HSET", KEYS[1], "delivery_status", "delivered", "delivered_at", ARGV[2])
  result = "delivered"
elseif ARGV[3] == "gone" then
  redis.call("HSET", KEYS[1], "delivery_status", "gone")
  result = "gone"
elseif n < tonumber(ARGV[5]) then
  redis.call("HSET", KEYS[1], "delivery_status", "scheduled", "delivery_next_at", ARGV[6])
  redis.call("ZADD", KEYS[2], ARGV[6], ARGV[7] .. ":" .. (n + 1))
  result = "scheduled"
else
  redis.call("HSET", KEYS[1], "delivery_status", "dead", "dead_at", ARGV[2])
  redis.call("LPUSH", KEYS[3], ARGV[10])
  redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[8]) - 1)
  result = "dead"
end
redis.call("EXPIRE", KEYS[1], ARGV[9])
return result
