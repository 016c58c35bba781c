#!lua flags=allow-oom
-- One round trip for the API's hot path: is the index known, which version is current, is the
-- answer cached for that version, and if not, who computes it (single flight).
-- KEYS[1]  index registry hash
-- ARGV[1]  index name      ARGV[2] cache key prefix    ARGV[3] query digest
-- ARGV[4]  request id ('' = no single flight)          ARGV[5] single-flight ttl (ms)
-- ARGV[6]  now (ms, LRU recency)
-- Returns {0} unknown index | {1, version, body} hit | {2, version} miss, no single flight
--       | {3, version} miss, caller leads | {4, version, leader id} miss, caller follows
local info = redis.call('HGET', KEYS[1], ARGV[1])
if not info then return {0} end
local version = cjson.decode(info)['version']
local key = ARGV[2] .. ':' .. ARGV[1] .. ':' .. version .. ':' .. ARGV[3]
local body = redis.call('GET', key)
if body then
  redis.call('ZADD', ARGV[2] .. ':lru', 'XX', ARGV[6], key)
  return {1, version, body}
end
if ARGV[4] == '' then return {2, version} end
local sf = key .. ':sf'
if redis.call('SET', sf, ARGV[4], 'NX', 'PX', ARGV[5]) then return {3, version} end
local leader = redis.call('GET', sf)
if not leader then
  redis.call('SET', sf, ARGV[4], 'PX', ARGV[5])
  return {3, version}
end
return {4, version, leader}
