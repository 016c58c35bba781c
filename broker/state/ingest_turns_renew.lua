#!lua flags=allow-oom
-- A running job's lease, another ARGV[2] ms from now (Redis's clock), while it still holds one.
-- KEYS[1] running jobs; ARGV[1] job id, ARGV[2] lease, ms
-- Returns 1 when renewed, 0 when the job holds none (its lease ended and it was queued again).
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then
  return 0
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
