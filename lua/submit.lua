-- submit: route TaskStartRequests of one partition through the registry
-- (submit_one in lib.lua), one or many per call: concurrent submits of a
-- process are sent together. If a key has no active run a queued run is
-- created and its request appended to the partition stream of its lane;
-- otherwise the conflict policy decides: join, skip, queue (one coalesced
-- follow-up) or replace.
-- KEYS[1] partition bulk request stream   KEYS[2] partition index
-- KEYS[3] partition retry queue
-- KEYS[4] partition watch key (views are published only while it exists)
-- KEYS[5] partition people request stream
-- per request i (1..n): KEYS[3+3i] task record   KEYS[4+3i] history
--   KEYS[5+3i] partition subjects of the request's scope (zset)
-- ARGV[1] history cap   ARGV[2] events channel   ARGV[3] cancel channel
-- ARGV[4] group   ARGV[5] retention (ms)
-- per request i, ARGV[j+1 .. j+8] with j = 5 + 8(i-1): task key, subject,
--   source, policy, new run id, stages (comma list), maxAttempts,
--   minInterval (ms, 0 = none)
-- returns per request: outcome, view (VIEW_FIELDS, US-separated: view_reply)
--   outcome: started | joined | queued | skipped | replaced | throttled
-- Cost: a repeated join or skip is one HMGET and one HSET of a counter
-- (plus TIME once per call); a new run adds XADD, HSET, RPUSH, ZADD index
-- (and the subjects ZADD for requests that are not schedule), EXISTS watch.
local now = now_ms()
local streams = {b = KEYS[1], p = KEYS[5]}
local out = {}
for i = 1, (#KEYS - 5) / 3 do
  local k, j = 3 + 3 * i, 5 + 8 * (i - 1)
  local task, source, policy = KEYS[k], ARGV[j + 3], ARGV[j + 4]
  local vals = submit_read(task, source, policy, '')
  local outcome, view = submit_fast(task, source, policy, vals, now)
  if not outcome then
    outcome, view = submit_one({task = task, hist = KEYS[k + 1], streams = streams, index = KEYS[2],
      subjects = KEYS[k + 2], retry = KEYS[3], watch = KEYS[4],
      key = ARGV[j + 1], subject = ARGV[j + 2], source = source, policy = policy, run_id = ARGV[j + 5],
      stages = ARGV[j + 6], max_attempts = ARGV[j + 7], min_interval = tonumber(ARGV[j + 8]), cap = ARGV[1],
      events = ARGV[2], cancels = ARGV[3], group = ARGV[4], retention = ARGV[5],
      occ_field = '', occ = '', now = now}, vals)
  end
  if not view then view = view_reply(nil, redis.call('HMGET', KEYS[k], unpack(VIEW_FIELDS)), 0) end
  out[#out + 1] = outcome
  out[#out + 1] = view
end
return out
