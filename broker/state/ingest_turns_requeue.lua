#!lua flags=allow-oom
-- Running jobs back to the front of their keys' lists: those whose lease ended (their worker
-- died; ARGV[3] = "expired") or the one named (ARGV[3] = a job id: its index was locked). The
-- key rejoins the ring's end (from parked, or because its list was empty).
-- KEYS[1] the ring, KEYS[2] parked keys, KEYS[3] queued tasks, KEYS[4] running jobs
-- ARGV[1] the keys' lists' prefix, ARGV[2] at most this many, ARGV[3] "expired" or a job id
-- Returns how many went back.
local jobs
if ARGV[3] == "expired" then
  local t = redis.call("TIME")
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  jobs = redis.call("ZRANGEBYSCORE", KEYS[4], "-inf", now, "LIMIT", 0, tonumber(ARGV[2]))
else
  jobs = {ARGV[3]}
end
local moved = 0
for _, job in ipairs(jobs) do
  if redis.call("ZREM", KEYS[4], job) == 1 then
    local task = redis.call("HGET", KEYS[3], job)
    if task then
      local key = cjson.decode(task)["key"]
      local first = redis.call("LPUSH", ARGV[1] .. key, job) == 1
      if redis.call("LREM", KEYS[2], 0, key) > 0 or first then
        redis.call("RPUSH", KEYS[1], key)
      end
      moved = moved + 1
    end
  end
end
return moved
