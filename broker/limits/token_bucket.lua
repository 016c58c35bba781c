#!lua flags=allow-oom
-- The door in one round trip: who is calling (API key), and may they (their token bucket and the
-- global one). Both buckets are checked first and debited only if both allow, so a request
-- refused by one bucket costs the other nothing.
--
-- KEYS[1] API keys hash (SHA-256 of key -> JSON record)   KEYS[2] the caller's bucket
-- KEYS[3] the global bucket
-- ARGV[1] SHA-256 of the presented key ('' = auth is off: no key, no per-key bucket)
-- ARGV[2] default rate (tokens/s)   ARGV[3] default burst   (a key's record may override both)
-- ARGV[4] global rate (tokens/s, <= 0: no global bucket)   ARGV[5] global burst
-- ARGV[6] cost (tokens)   ARGV[7] '1' = rate limiting on, '0' = only authenticate
-- ARGV[8] now (ms; '' = Redis TIME)
-- Returns {status, principal, limit, remaining, retry_after_ms, scope, scopes}
--   status 1 allowed, 0 rate limited, -1 unknown or revoked key
--   limit/remaining describe the caller's bucket (the global one when there is none); scope
--   names the bucket that refused ('key' or 'global'), '' when allowed; scopes: the key's
--   recorded scopes, space-separated ('-' when it has none recorded: a key made before them).
local principal = 'anonymous'
local scopes = '-'
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
if ARGV[1] ~= '' then
  local raw = redis.call('HGET', KEYS[1], ARGV[1])
  if not raw then return {-1, '', 0, 0, 0, ''} end
  local record = cjson.decode(raw)
  if record['revoked'] then return {-1, '', 0, 0, 0, ''} end
  principal = record['id']
  if type(record['scopes']) == 'table' then scopes = table.concat(record['scopes'], ' ') end
  if type(record['rate']) == 'number' then rate = record['rate'] end
  if type(record['burst']) == 'number' then burst = record['burst'] end
else
  rate = 0  -- no identity, no per-key bucket: only the global one applies
end
if ARGV[7] ~= '1' then return {1, principal, 0, 0, 0, '', scopes} end

local now
if ARGV[8] ~= '' then
  now = tonumber(ARGV[8])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local cost = tonumber(ARGV[6])

-- A bucket: {key, rate, burst, tokens after refill}; nil when its rate says "no bucket".
local function bucket(key, r, b)
  if r <= 0 or b <= 0 then return nil end
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or ts == nil then
    tokens = b
  else
    tokens = math.min(b, tokens + math.max(0, now - ts) * r / 1000)
  end
  return {key, r, b, tokens}
end

local mine = bucket(KEYS[2], rate, burst)
local global = bucket(KEYS[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
local shown = mine or global

local retry_ms, scope = 0, ''
local function short(b, name)
  if b and b[4] < cost then
    local wait = math.ceil((cost - b[4]) * 1000 / b[2])
    if wait > retry_ms then retry_ms, scope = wait, name end
  end
end
short(mine, 'key')
short(global, 'global')
if scope ~= '' then
  return {0, principal, shown[3], math.floor(shown[4]), retry_ms, scope, scopes}
end

local function debit(b)
  b[4] = b[4] - cost
  redis.call('HSET', b[1], 'tokens', string.format('%.6f', b[4]), 'ts', tostring(now))
  -- Gone once it would be full again anyway: an idle caller costs no memory.
  redis.call('PEXPIRE', b[1], math.ceil(b[3] * 1000 / b[2]) + 1000)
end
if mine then debit(mine) end
if global then debit(global) end
if shown then
  return {1, principal, shown[3], math.floor(shown[4]), 0, '', scopes}
end
return {1, principal, 0, 0, 0, '', scopes}
