#!lua flags=allow-oom
-- A job ended: its task and lease go, and its key, parked while it ran, rejoins the ring's end.
-- KEYS[1] the ring, KEYS[2] parked keys, KEYS[3] queued tasks, KEYS[4] running jobs
-- ARGV[1] the API key id, ARGV[2] job id
redis.call("ZREM", KEYS[4], ARGV[2])
redis.call("HDEL", KEYS[3], ARGV[2])
if redis.call("LREM", KEYS[2], 0, ARGV[1]) > 0 then
  redis.call("RPUSH", KEYS[1], ARGV[1])
end
return 1
