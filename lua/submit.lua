-- submit: route one TaskStartRequest through the registry (submit_one in
-- lib.lua). If the key has no active run a queued run is created and its
-- request appended to the partition stream of its lane; otherwise the
-- conflict policy decides: join, skip, queue (one coalesced follow-up) or
-- replace.
-- KEYS[1] task record   KEYS[2] partition bulk request stream   KEYS[3] history
-- KEYS[4] partition index   KEYS[5] partition subjects of the scope (zset)
-- KEYS[6] partition retry queue
-- KEYS[7] partition watch key (views are published only while it exists)
-- KEYS[8] partition people request stream
-- ARGV[1] task key   ARGV[2] subject   ARGV[3] source   ARGV[4] policy
-- ARGV[5] new run id   ARGV[6] stages (comma list)   ARGV[7] maxAttempts
-- ARGV[8] minInterval (ms, 0 = none)   ARGV[9] history cap
-- ARGV[10] events channel   ARGV[11] cancel channel   ARGV[12] group
-- ARGV[13] retention (ms)
-- returns {outcome, HMGET of VIEW_FIELDS after the request}
--   outcome: started | joined | queued | skipped | replaced | throttled
-- Cost: a repeated join, skip or queue is TIME, HMGET, HSET and the reply's
-- HMGET; a new run adds XADD, RPUSH, ZADD index (and the subjects ZADD for
-- requests that are not schedule), EXISTS watch.
local outcome = submit_one({task = KEYS[1], hist = KEYS[3], streams = {b = KEYS[2], p = KEYS[8]}, index = KEYS[4],
  subjects = KEYS[5], retry = KEYS[6], watch = KEYS[7],
  key = ARGV[1], subject = ARGV[2], source = ARGV[3], policy = ARGV[4], run_id = ARGV[5],
  stages = ARGV[6], max_attempts = ARGV[7], min_interval = tonumber(ARGV[8]), cap = ARGV[9],
  events = ARGV[10], cancels = ARGV[11], group = ARGV[12], retention = ARGV[13],
  occ_field = '', occ = '', now = now_ms()})
return {outcome, redis.call('HMGET', KEYS[1], unpack(VIEW_FIELDS))}
