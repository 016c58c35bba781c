#!lua flags=allow-oom
-- Take the delivery attempts that are due, leasing each (its score moves lease seconds ahead)
-- rather than removing it: a poller that dies before it enqueues them loses nothing, and two
-- pollers never take the same member. The attempt's claim removes it (webhook_claim.lua): a task
-- that never arrives is sent again when the lease ends.
-- KEYS[1] schedule (sorted set), ARGV[1] now, ARGV[2] lease s, ARGV[3] limit
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, ARGV[3])
local until_ = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, member in ipairs(due) do
  redis.call("ZADD", KEYS[1], "XX", until_, member)
end
return due
