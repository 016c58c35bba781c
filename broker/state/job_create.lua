-- Create a job record, or return the job an Idempotency-Key already names; one atomic step so
-- two concurrent requests with the same key cannot both create a job. Then keep the owner within
-- its budgets of records, in count and in bytes: past either, its oldest records that are
-- finished with nothing left to deliver are removed (a running job, or a webhook still to send,
-- is never touched).
-- KEYS[1] job hash, KEYS[2] idempotency key (ignored unless ARGV[4] == "1"), KEYS[3] the owner's
-- job index (sorted set: job id -> created, unix s), KEYS[4] the owner's byte index (hash: job
-- id -> bytes of its finished record, and "total"; job_finish.lua adds each record once final)
-- ARGV[1] job id, ARGV[2] job ttl s, ARGV[3] idempotency ttl s, ARGV[4] "1" to use the key,
-- ARGV[5] records per owner, ARGV[6] now, ARGV[7] job key prefix ("<prefix>:job:"),
-- ARGV[8] bytes of finished records per owner, ARGV[9] the owner's cap on unfinished jobs (0: none),
-- ARGV[10..] field, value, ...
-- KEYS[5] the owner's jobs not yet seen finished (sorted set: job id -> created, unix s)
-- Returns {1, job_id} when created, {0, existing_job_id} on a replay, {-1, ""} past the cap.
if ARGV[4] == "1" then
  local existing = redis.call("GET", KEYS[2])
  if existing then
    return {0, existing}
  end
  redis.call("SET", KEYS[2], ARGV[1], "EX", ARGV[3])
end

-- Reads only until the record is written: on a Redis at its memory limit that first write is
-- refused, and a script that had already written (a ZREM) would be let through whole.
local open, cap = KEYS[5], tonumber(ARGV[9])
local finished = {}
if cap > 0 then
  -- A job leaves the set here, once its record is final or gone: no worker, cancel or expiry
  -- has to remember to take it out.
  local members = redis.call("ZRANGE", open, 0, -1)
  for _, id in ipairs(members) do
    local status = redis.call("HGET", ARGV[7] .. id, "status")
    if not status or status == "done" or status == "failed" or status == "cancelled" then
      finished[#finished + 1] = id
    end
  end
  if #members - #finished >= cap then
    if ARGV[4] == "1" then
      redis.call("DEL", KEYS[2]) -- set above, in this same step: a retry with the key starts afresh
    end
    return {-1, ""}
  end
end

redis.call("HSET", KEYS[1], unpack(ARGV, 10))
redis.call("EXPIRE", KEYS[1], ARGV[2])
if cap > 0 then
  for _, id in ipairs(finished) do
    redis.call("ZREM", open, id)
  end
  redis.call("ZADD", open, ARGV[6], ARGV[1])
  redis.call("EXPIRE", open, ARGV[2])
end

local index, budget, sizes, max_bytes = KEYS[3], tonumber(ARGV[5]), KEYS[4], tonumber(ARGV[8])
redis.call("ZADD", index, ARGV[6], ARGV[1])
redis.call("EXPIRE", index, ARGV[2])
local over = redis.call("ZCARD", index) - budget
local bytes = tonumber(redis.call("HGET", sizes, "total")) or 0
if over > 0 or bytes > max_bytes then
  -- The oldest first; a bounded look, so a key with many running jobs costs each create little.
  for _, id in ipairs(redis.call("ZRANGE", index, 0, math.max(over, 0) + 99)) do
    if over <= 0 and bytes <= max_bytes then
      break
    end
    local key = ARGV[7] .. id
    local f = redis.call("HMGET", key, "status", "webhook_url", "delivery_status")
    local final = f[1] == "done" or f[1] == "failed" or f[1] == "cancelled"
    local delivered = not f[2] or f[3] == "delivered" or f[3] == "gone" or f[3] == "dead"
    if not f[1] or (final and delivered) then
      redis.call("DEL", key)
      redis.call("ZREM", index, id)
      over = over - 1
      -- A record gone on its own (its TTL) leaves its size here until now.
      local size = tonumber(redis.call("HGET", sizes, id)) or 0
      if size > 0 then
        redis.call("HDEL", sizes, id)
        bytes = bytes - size
        redis.call("HINCRBY", sizes, "total", -size)
      end
    end
  end
end
return {1, ARGV[1]}
