#!lua flags=allow-oom
-- Give memory back while Redis is near its limit: evict the cache's least recently used entries.
-- It only frees memory (and rewrites the byte total), so it runs on a full Redis too.
-- ARGV[1] LRU sorted set  ARGV[2] sizes hash (entry -> bytes)  ARGV[3] bytes total  ARGV[4] how many
-- Returns how many entries were evicted.
local lru, sizes, total_key = ARGV[1], ARGV[2], ARGV[3]
local oldest = redis.call('ZPOPMIN', lru, tonumber(ARGV[4]))
local freed = 0
for i = 1, #oldest, 2 do -- member, score pairs
  freed = freed + (tonumber(redis.call('HGET', sizes, oldest[i])) or 0)
  redis.call('HDEL', sizes, oldest[i])
  redis.call('DEL', oldest[i])
end
local total = tonumber(redis.call('GET', total_key))
if total and freed > 0 then
  redis.call('SET', total_key, math.max(total - freed, 0), 'KEEPTTL')
end
return #oldest / 2
