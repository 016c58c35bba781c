#!lua flags=allow-oom
-- The next turn: the ring's first key gives up its oldest job, which runs under a lease. A key
-- with more jobs waits parked until that job ends (then it rejoins the ring at its end), so a
-- key that joins meanwhile goes first: one key's backlog delays another's upload by the job
-- running, no more. With the ring empty, a parked key's next job runs at once: no worker idles
-- while jobs wait. Server time: workers' clocks differ.
-- KEYS[1] the ring, KEYS[2] parked keys (list), KEYS[3] queued tasks, KEYS[4] running jobs
-- (sorted set: job id -> lease end, ms)
-- ARGV[1] the keys' lists' prefix ("<prefix>:ingest-waiting:"), ARGV[2] lease, ms
-- Returns {job id, task JSON}, or nil when no job waits.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _ = 1, redis.call("LLEN", KEYS[1]) + redis.call("LLEN", KEYS[2]) do
  local key = redis.call("LPOP", KEYS[1]) or redis.call("LPOP", KEYS[2])
  if not key then
    return false
  end
  local list = ARGV[1] .. key
  local job = redis.call("LPOP", list)
  if job and redis.call("LLEN", list) > 0 then
    redis.call("RPUSH", KEYS[2], key)
  end
  local task = job and redis.call("HGET", KEYS[3], job)
  if task then
    redis.call("ZADD", KEYS[4], now + tonumber(ARGV[2]), job)
    return {job, task}
  end
end
return false
