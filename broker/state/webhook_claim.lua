#!lua flags=allow-oom
-- Claim delivery attempt n of a job's webhook. A duplicate or redelivered task for an attempt
-- that already concluded, or that another worker holds a live lease on, gets no claim; a task
-- redelivered after its worker died mid-attempt (lease expired) takes the attempt over.
-- The attempt's schedule entry goes here, whatever the answer: the task has arrived. Until then
-- the poller's lease brings it back, so a task lost on its way (a failover after its push) is
-- sent again.
-- KEYS[1] job hash, KEYS[2] schedule (sorted set), ARGV[1] attempt n, ARGV[2] now,
-- ARGV[3] lease s, ARGV[4] the attempt's schedule member ("{job id}:{n}")
-- Returns {"go", field, value, ...} (the whole record) or {reason}.
redis.call("ZREM", KEYS[2], ARGV[4])
local f = redis.call("HMGET", KEYS[1], "status", "delivery_status", "delivery_attempts",
  "delivery_inflight", "delivery_lease_until")
if not f[1] then
  return {"missing"}
end
local ds = f[2] or ""
if ds == "delivered" or ds == "dead" or ds == "gone" then
  return {"concluded"}
end
local n = tonumber(ARGV[1])
local done = tonumber(f[3] or "0")
if n ~= done + 1 then
  return {"stale"}
end
if f[4] == ARGV[1] and tonumber(f[5] or "0") > tonumber(ARGV[2]) then
  return {"busy"}
end
redis.call("HSET", KEYS[1], "delivery_status", "delivering", "delivery_inflight", ARGV[1],
  "delivery_lease_until", tonumber(ARGV[2]) + tonumber(ARGV[3]))
local out = {"go"}
for _, v in ipairs(redis.call("HGETALL", KEYS[1])) do
  out[#out + 1] = v
end
return out
