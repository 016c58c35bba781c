-- Queue an ingest job at the end of its API key's list; a key whose list was empty joins the
-- ring of keys whose turn comes, at its end. A key with waiting jobs is in the ring, or parked
-- (a job of its own is running: it rejoins the ring when that job ends), never both.
-- Not flagged allow-oom: new work is refused on a full Redis (the API answers 503).
-- KEYS[1] the ring (list of keys), KEYS[2] queued tasks (hash: job id -> JSON), KEYS[3] the key's list
-- ARGV[1] the API key id, ARGV[2] job id, ARGV[3] the queued task (JSON)
redis.call("HSET", KEYS[2], ARGV[2], ARGV[3])
if redis.call("RPUSH", KEYS[3], ARGV[2]) == 1 then
  redis.call("RPUSH", KEYS[1], ARGV[1])
end
return 1
