-- Refresh the shared backpressure snapshot, at most once per lease, in one round trip.
-- Whoever wins the lease measures the queues and folds the completions since the last refresh
-- into each queue's service-rate EWMA; everyone else gets the current snapshot back.
--
-- KEYS[1] snapshot hash     KEYS[2] lease     KEYS[3] kombu's unacked hash
-- then for queue i (0-based): KEYS[4+6i] its done hash {requests, tasks, seconds},
--                             KEYS[5+6i .. 8+6i] its priority lists (kombu: q, q\x06\x163, ...),
--                             KEYS[9+6i] its worker heartbeats (sorted set, unix seconds)
-- ARGV[1] lease (ms)   ARGV[2] EWMA time constant (s)   ARGV[3] now (ms; '' = Redis TIME)
-- ARGV[4] heartbeat ttl (s)   ARGV[5..] queue names, in KEYS order
-- Returns {1, fields} after a refresh, {0, fields} when another process holds the lease;
-- fields are the snapshot hash as HGETALL gives it.
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return {0, redis.call('HGETALL', KEYS[1])}
end

local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local tau = tonumber(ARGV[2])
local queues = {}
local in_flight = {}
local heartbeat_ttl = tonumber(ARGV[4])
for i = 5, #ARGV do
  queues[#queues + 1] = ARGV[i]
  in_flight[ARGV[i]] = 0
end

-- kombu keeps each delivered, unacknowledged message as JSON [payload, exchange, routing_key].
-- Only the last 256 bytes are matched: an unanchored pattern over a whole payload (a generation
-- task carries its sources) retries at every quote, and took this script to 15-200 ms under
-- load, stalling every other Redis client meanwhile.
for _, raw in ipairs(redis.call('HVALS', KEYS[3])) do
  local exchange, routing_key = string.match(string.sub(raw, -256), '"([^"]*)"%s*,%s*"([^"]*)"%s*%]%s*$')
  if routing_key and in_flight[routing_key] then
    in_flight[routing_key] = in_flight[routing_key] + 1
  elseif exchange and in_flight[exchange] then
    in_flight[exchange] = in_flight[exchange] + 1
  end
end

local prev_t = tonumber(redis.call('HGET', KEYS[1], 't'))
local dt = prev_t and (now - prev_t) / 1000 or 0
-- After a long gap nobody refreshed (no API running), the deltas say nothing about the rate.
local fresh = prev_t ~= nil and dt > 0 and dt <= 30
local alpha = fresh and (1 - math.exp(-dt / tau)) or 0
local fields = {'t', tostring(now)}

local function fmt(x) return string.format('%.6f', x) end

for i, q in ipairs(queues) do
  local base = 4 + (i - 1) * 6
  local waiting = 0
  for j = 1, 4 do waiting = waiting + redis.call('LLEN', KEYS[base + j]) end
  local done = redis.call('HMGET', KEYS[base], 'requests', 'tasks', 'seconds')
  local done_requests = tonumber(done[1]) or 0
  local done_tasks = tonumber(done[2]) or 0
  local done_seconds = tonumber(done[3]) or 0
  local prev = redis.call('HMGET', KEYS[1], q .. ':depth', q .. ':done_requests', q .. ':done_tasks',
    q .. ':rate', q .. ':task_rate', q .. ':known', q .. ':done_seconds', q .. ':service')
  local prev_depth = tonumber(prev[1]) or 0
  local rate = tonumber(prev[4]) or 0
  local task_rate = tonumber(prev[5]) or 0
  local known = tonumber(prev[6]) or 0
  local service = tonumber(prev[8]) or 0
  if fresh and prev[2] then
    -- A counter that went backwards was reset (FLUSHDB): count nothing for this interval.
    local d_requests = math.max(0, done_requests - tonumber(prev[2]))
    local d_tasks = math.max(0, done_tasks - tonumber(prev[3]))
    -- The rate is what the queue serves while it has work: idle intervals leave it alone, so a
    -- burst after a quiet spell meets the last busy rate, not a rate decayed to zero. Busy
    -- intervals without a completion pull it down, which is how a stalled queue shows.
    if prev_depth > 0 or d_tasks > 0 then
      rate = rate + alpha * (d_requests / dt - rate)
      task_rate = task_rate + alpha * (d_tasks / dt - task_rate)
      if d_tasks > 0 then known = 1 end
    end
    -- Service time: what one task takes served alone, as the lower envelope of recent tasks'
    -- times: it falls at once to a quicker mean and rises slowly (a fiftieth per task) towards a
    -- slower one, since tasks served together with many others take longer than one alone. (An
    -- EWMA learnt the loaded time, refused everything by it, and, with nothing admitted, never
    -- saw a task to unlearn it.)
    local d_seconds = done_seconds - (tonumber(prev[7]) or 0)
    if d_tasks > 0 and d_seconds > 0 then
      local mean = d_seconds / d_tasks
      if service == 0 or mean < service then
        service = mean
      else
        service = service + (1 - 0.98 ^ d_tasks) * (mean - service)
      end
    end
  end
  local depth = waiting + in_flight[q]
  local live = redis.call('ZCOUNT', KEYS[base + 5], now / 1000 - heartbeat_ttl, '+inf')
  fields[#fields + 1] = q .. ':waiting';       fields[#fields + 1] = tostring(waiting)
  fields[#fields + 1] = q .. ':in_flight';     fields[#fields + 1] = tostring(in_flight[q])
  fields[#fields + 1] = q .. ':depth';         fields[#fields + 1] = tostring(depth)
  fields[#fields + 1] = q .. ':done_requests'; fields[#fields + 1] = tostring(done_requests)
  fields[#fields + 1] = q .. ':done_tasks';    fields[#fields + 1] = tostring(done_tasks)
  fields[#fields + 1] = q .. ':rate';          fields[#fields + 1] = fmt(rate)
  fields[#fields + 1] = q .. ':task_rate';     fields[#fields + 1] = fmt(task_rate)
  fields[#fields + 1] = q .. ':known';         fields[#fields + 1] = tostring(known)
  fields[#fields + 1] = q .. ':live_workers';  fields[#fields + 1] = tostring(live)
  fields[#fields + 1] = q .. ':done_seconds';  fields[#fields + 1] = fmt(done_seconds)
  fields[#fields + 1] = q .. ':service';       fields[#fields + 1] = fmt(service)
end
redis.call('HSET', KEYS[1], unpack(fields))
return {1, fields}
