#!lua flags=allow-oom
-- Refresh the shared backpressure snapshot, at most once per lease, in one round trip.
-- Whoever wins the lease measures the queues and folds the tasks finished since the last refresh
-- into each queue's service-time sums; everyone else gets the current snapshot back.
--
-- KEYS[1] snapshot hash     KEYS[2] lease     KEYS[3] kombu's unacked hash
-- then for queue i (0-based): KEYS[4+6i] its done hash (see count_done in backpressure.py),
--                             KEYS[5+6i .. 8+6i] its priority lists (kombu: q, q\x06\x163, ...),
--                             KEYS[9+6i] its worker heartbeats (sorted set, unix seconds)
-- ARGV[1] lease (ms)   ARGV[2] rate EWMA time constant (s)   ARGV[3] now (ms; '' = Redis TIME)
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

-- Service times are kept per concurrency bucket (service_times.py): bucket b's counters in the
-- done hash are b<b>_tasks, b<b>_requests, b<b>_concurrency and b<b>_seconds (running totals, as
-- count_done writes them), and its recency-weighted sums in the snapshot fit<b>_n, _r, _c, _s.
-- Each finished task's weight falls by KEEP per later task of its own bucket: a level's time is
-- that of its last few tasks, and neither idle time nor tasks at other levels change it.
local KEEP = 0.9
local BUCKETS = 6  -- service_times.BUCKETS
local COUNTERS = {'tasks', 'requests', 'concurrency', 'seconds'}
local SUMS = {'n', 'r', 'c', 's'}

for i, q in ipairs(queues) do
  local base = 4 + (i - 1) * 6
  local waiting = 0
  for j = 1, 4 do waiting = waiting + redis.call('LLEN', KEYS[base + j]) end
  local counter_names, prev_names = {'slots'}, {q .. ':waiting', q .. ':rate', q .. ':known', q .. ':busy_ms', q .. ':slots'}
  for b = 0, BUCKETS - 1 do
    for _, c in ipairs(COUNTERS) do
      counter_names[#counter_names + 1] = 'b' .. b .. '_' .. c
      prev_names[#prev_names + 1] = q .. ':done_b' .. b .. '_' .. c
    end
    for _, f in ipairs(SUMS) do prev_names[#prev_names + 1] = q .. ':fit' .. b .. '_' .. f end
  end
  local done = redis.call('HMGET', KEYS[base], unpack(counter_names))
  local prev = redis.call('HMGET', KEYS[1], unpack(prev_names))
  local prev_waiting = tonumber(prev[1]) or 0
  local rate = tonumber(prev[2]) or 0
  local known = tonumber(prev[3]) or 0
  local busy_ms = tonumber(prev[4]) or 0
  local slots = tonumber(done[1]) or tonumber(prev[5]) or 1
  -- Per bucket: its counters' totals now (as the done hash writes them: kept so, a total read
  -- back is the same number, where one rounded up would read as a counter that went backwards
  -- and stop all counting), what they grew by since the last refresh, its sums.
  local totals, raw_totals, deltas, sums = {}, {}, {}, {}
  -- A previous refresh measured this queue, so the deltas mean something (a bucket it did not
  -- write had no tasks then), and no counter went backwards (a reset, FLUSHDB: count nothing
  -- for this refresh).
  local counted = prev[1] ~= false
  local per = #COUNTERS + #SUMS
  for b = 0, BUCKETS - 1 do
    totals[b], raw_totals[b], deltas[b], sums[b] = {}, {}, {}, {}
    for k = 1, #COUNTERS do
      raw_totals[b][k] = done[1 + b * #COUNTERS + k] or '0'
      local now_total = tonumber(raw_totals[b][k]) or 0
      local d = now_total - (tonumber(prev[5 + b * per + k]) or 0)
      if d < 0 then counted = false end
      totals[b][k], deltas[b][k] = now_total, d
    end
    for k = 1, #SUMS do sums[b][k] = tonumber(prev[5 + b * per + #COUNTERS + k]) or 0 end
  end
  local d_requests, d_tasks = 0, 0
  if counted then
    for b = 0, BUCKETS - 1 do
      local d = deltas[b]
      if d[1] > 0 then
        -- Service times: what the tasks took in the worker, at the concurrency they ran at;
        -- admission reads each bucket's mean (ServiceTimes in service_times.py).
        local keep = KEEP ^ d[1]
        for k = 1, #SUMS do sums[b][k] = sums[b][k] * keep + d[k] end
        d_tasks, d_requests = d_tasks + d[1], d_requests + d[2]
        known = 1
      end
    end
  end
  if fresh then
    -- The completion rate is for the gauge only (admission does not read it). It moves while work
    -- waits or tasks finish; a task still running with nothing behind it says nothing about the
    -- rate until it ends (decaying it then is what made one slow request look like a stall).
    if prev_waiting > 0 or d_tasks > 0 then rate = rate + alpha * (d_requests / dt - rate) end
    -- How long work has waited without a task finishing: how a stall shows. Tasks held with
    -- nothing behind them block no new request, and one may be held by no worker at all: kombu
    -- keeps a task whose ack was lost (Redis restarted meanwhile) unacked until the visibility
    -- timeout hands it back. Counted as a stall, that refused every request, so nothing
    -- finished and the stall never ended.
    if d_tasks > 0 or prev_waiting == 0 then busy_ms = 0 else busy_ms = busy_ms + dt * 1000 end
  end
  local depth = waiting + in_flight[q]
  if waiting == 0 then busy_ms = 0 end
  local live = redis.call('ZCOUNT', KEYS[base + 5], now / 1000 - heartbeat_ttl, '+inf')
  -- A worker that has just come up (started again after a crash, say) is not part of the stall
  -- measured before it: what waited for it through the outage would otherwise read as a queue it
  -- does not serve, and every strict request be refused until its first task ends.
  if live > (tonumber(redis.call('HGET', KEYS[1], q .. ':live_workers')) or 0) then busy_ms = 0 end
  local function put(name, value) fields[#fields + 1] = q .. ':' .. name; fields[#fields + 1] = value end
  put('waiting', tostring(waiting))
  put('in_flight', tostring(in_flight[q]))
  put('depth', tostring(depth))
  put('rate', fmt(rate))
  put('known', tostring(known))
  put('live_workers', tostring(live))
  put('slots', tostring(slots))
  put('busy_ms', tostring(math.floor(busy_ms)))
  for b = 0, BUCKETS - 1 do
    -- Only the buckets that have seen tasks: the snapshot every API process reads stays small.
    -- One written before is written again (its counters reset to 0 after a FLUSHDB, say).
    if totals[b][1] > 0 or prev[5 + b * per + 1] then
      for k, c in ipairs(COUNTERS) do put('done_b' .. b .. '_' .. c, raw_totals[b][k]) end
      for k, f in ipairs(SUMS) do put('fit' .. b .. '_' .. f, fmt(sums[b][k])) end
    end
  end
end
redis.call('HSET', KEYS[1], unpack(fields))
return {1, fields}
