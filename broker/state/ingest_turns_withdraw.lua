#!lua flags=allow-oom
-- A queued job taken out again (its upload's task could not be sent): off its key's list, and
-- the key off the ring (or parked) when that leaves its list empty.
-- KEYS[1] the ring, KEYS[2] parked keys, KEYS[3] queued tasks, KEYS[4] the key's list
-- ARGV[1] the API key id, ARGV[2] job id
redis.call("HDEL", KEYS[3], ARGV[2])
redis.call("LREM", KEYS[4], 0, ARGV[2])
if redis.call("LLEN", KEYS[4]) == 0 then
  redis.call("LREM", KEYS[1], 0, ARGV[1])
  redis.call("LREM", KEYS[2], 0, ARGV[1])
end
return 1
