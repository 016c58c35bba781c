#!lua flags=allow-oom
-- Move a job forward to a non-final stage and/or set fields, never backwards and never out of a
-- final state: a redelivered or late task cannot undo progress or a cancellation.
-- KEYS[1] job hash
-- ARGV[1] new stage ("" = none), ARGV[2] now, ARGV[3] job ttl s,
-- ARGV[4] mode the stage change requires ("" = any), ARGV[5..] field, value, ...
-- Returns {outcome, status, mode}; outcome: missing | final | moved | same.
local rank = {queued = 0, retrieving = 1, ingesting = 1, generating = 2, done = 3, failed = 3, cancelled = 3}
local cur = redis.call("HMGET", KEYS[1], "status", "mode")
if not cur[1] then
  return {"missing", "", ""}
end
if rank[cur[1]] == 3 then
  return {"final", cur[1], cur[2] or ""}
end
if #ARGV >= 5 then
  redis.call("HSET", KEYS[1], unpack(ARGV, 5))
end
local new = ARGV[1]
if new ~= "" and rank[new] < 3 and rank[new] > rank[cur[1]] and (ARGV[4] == "" or ARGV[4] == cur[2]) then
  redis.call("HSET", KEYS[1], "status", new, "updated_at", ARGV[2], new .. "_at", ARGV[2])
  redis.call("EXPIRE", KEYS[1], ARGV[3])
  return {"moved", new, cur[2] or ""}
end
return {"same", cur[1], cur[2] or ""}
