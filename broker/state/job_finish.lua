#!lua flags=allow-oom
-- Append a request's final event and move its job to a final state, in one atomic step, so no
-- crash can leave "answered" without "done" or the reverse. Only the first final transition
-- wins ("first"); it also schedules the webhook's first attempt in the same step, so a webhook
-- is never lost between "done written" and "callback enqueued", and never scheduled twice.
-- The finished record's size is added to its owner's byte index (the record budget's measure,
-- see job_create.lua), and the stream's owner key expires with the stream.
-- KEYS[1] job hash, KEYS[2] event stream, KEYS[3] webhook schedule (sorted set),
-- KEYS[4] the stream's owner key
-- ARGV[1] final status (done | failed | cancelled), ARGV[2] now, ARGV[3] job ttl s,
-- ARGV[4] finished stream ttl s, ARGV[5] stream maxlen, ARGV[6] event type, ARGV[7] event data
-- (JSON), ARGV[8] job id, ARGV[9] byte index key prefix ("<prefix>:jobbytes:"),
-- ARGV[10..] field, value, ... (result or error)
-- Returns missing | late | first.
local rank = {queued = 0, retrieving = 1, ingesting = 1, generating = 2, done = 3, failed = 3, cancelled = 3}
local cur = redis.call("HMGET", KEYS[1], "status", "webhook_url", "owner")
-- A late duplicate (a task redelivered while its first copy still ran) adds no second answer.
if cur[1] and rank[cur[1]] == 3 then
  return "late"
end
redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[5], "*", "type", ARGV[6], "data", ARGV[7])
redis.call("EXPIRE", KEYS[2], ARGV[4])
redis.call("EXPIRE", KEYS[4], ARGV[4])
if not cur[1] then
  return "missing"
end
local status = ARGV[1]
redis.call("HSET", KEYS[1], "status", status, "updated_at", ARGV[2], status .. "_at", ARGV[2])
if #ARGV >= 10 then
  redis.call("HSET", KEYS[1], unpack(ARGV, 10))
end
if cur[2] and cur[2] ~= "" then
  redis.call("HSET", KEYS[1], "delivery_status", "scheduled", "delivery_next_at", ARGV[2])
  redis.call("ZADD", KEYS[3], ARGV[2], ARGV[8] .. ":1")
end
redis.call("EXPIRE", KEYS[1], ARGV[3])
if cur[3] then
  -- Its size once final (delivery fields, a few hundred bytes, come later and are not counted).
  local size = 0
  for _, v in ipairs(redis.call("HGETALL", KEYS[1])) do
    size = size + #v
  end
  local sizes = ARGV[9] .. cur[3]
  redis.call("HSET", sizes, ARGV[8], size)
  redis.call("HINCRBY", sizes, "total", size)
  redis.call("EXPIRE", sizes, ARGV[3])
end
return "first"
