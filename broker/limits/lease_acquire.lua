#!lua flags=allow-oom
-- Take one of a key's leases of one kind, unless it already holds its cap of them. Expired
-- leases (their API process died, say, before releasing them) are dropped first, so nothing
-- else has to clean up after a process that is gone. Server time: API processes' clocks differ.
-- KEYS[1] the leases (sorted set: lease id -> expiry, unix ms)
-- ARGV[1] lease id, ARGV[2] cap, ARGV[3] the lease's time to live, ms
-- Returns 1 when taken, 0 past the cap.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
if redis.call("ZCARD", KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
-- Every lease has the same time to live: the set outlives its newest lease, and no longer.
redis.call("PEXPIRE", KEYS[1], ARGV[3])
return 1
