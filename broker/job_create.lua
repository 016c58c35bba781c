-- Create a job record, or return the job an Idempotency-Key already names; one atomic step so
-- two concurrent requests with the same key cannot both create a job.
-- KEYS[1] job hash, KEYS[2] idempotency key (ignored unless ARGV[4] == "1")
-- ARGV[1] job id, ARGV[2] job ttl s, ARGV[3] idempotency ttl s, ARGV[4] "1" to use the key,
-- ARGV[5..] field, value, ...
-- Returns {1, job_id} when created, {0, existing_job_id} on a replay.
if ARGV[4] == "1" then
  local existing = redis.call("GET", KEYS[2])
  if existing then
    return {0, existing}
  end
  redis.call("SET", KEYS[2], ARGV[1], "EX", ARGV[3])
end
redis.call("HSET", KEYS[1], unpack(ARGV, 5))
redis.call("EXPIRE", KEYS[1], ARGV[2])
return {1, ARGV[1]}
