#!lua flags=allow-oom
-- One worker's heartbeat: admission counts live workers by it, so it is written on a full Redis
-- too (one member per worker, overwritten), else every worker would look dead there.
-- KEYS[1] the queue's heartbeats (sorted set), ARGV[1] now (unix s), ARGV[2] worker id
return redis.call("ZADD", KEYS[1], ARGV[1], ARGV[2])
