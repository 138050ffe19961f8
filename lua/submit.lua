-- submit: route TaskStartRequests through the registry (submit_one in
-- lib.lua), one or many per call: concurrent submits of a process are sent
-- together, and on a single Redis (not Cluster) the requests of several
-- partitions share one call, so the fixed cost of a script call is paid
-- once per batch. If a key has no active run a queued run is created and
-- its request appended to the partition stream of its lane; otherwise the
-- conflict policy decides: join, skip, queue (one coalesced follow-up) or
-- replace.
-- KEYS, per partition block q (1..np), KEYS[5q-4 .. 5q]: bulk request
--   stream, index, retry queue, watch key (views are published only while
--   it exists), people request stream
-- then per request i (1..n), with b = 5np: KEYS[b+3i-2] task record
--   KEYS[b+3i-1] history   KEYS[b+3i] subjects of the request's scope (zset)
-- ARGV[1] history cap   ARGV[2] group   ARGV[3] retention (ms)   ARGV[4] np
-- per partition block q: ARGV[3+2q] events channel   ARGV[4+2q] cancel channel
-- per request i, ARGV[j+1 .. j+9] with j = 4 + 2np + 9(i-1): partition
--   block q, task key, subject, source, policy, new run id, stages (comma
--   list), maxAttempts, minInterval (ms, 0 = none)
-- returns per request: outcome, view (VIEW_FIELDS, US-separated: view_reply;
--   for started, only the server time in ms: the caller knows the rest)
--   outcome: started | joined | queued | skipped | replaced | throttled
-- Cost: a repeated join or skip is one HMGET of 9 fields and one HSET of a
-- counter (the view comes from the record's cache, see submit_fast; plus
-- TIME once per call); a new run is that HMGET, XADD, HSET, RPUSH, ZADD
-- index (and the subjects ZADD for requests that are not schedule), EXISTS
-- watch.
local now = now_ms()
local np = tonumber(ARGV[4])
local base_k, base_a = 5 * np, 4 + 2 * np
local blocks = {}
local out = {}
-- submit_one's arguments: one table for the call, its per-request fields
-- rewritten (a table per request cost more than the rest of a new run's Lua)
local a = {cap = ARGV[1], group = ARGV[2], retention = ARGV[3], occ_field = '', occ = '', now = now}
for i = 1, (#KEYS - base_k) / 3 do
  local k, j = base_k + 3 * i - 2, base_a + 9 * (i - 1)
  local task, source, policy = KEYS[k], ARGV[j + 4], ARGV[j + 5]
  local outcome, view = submit_fast(task, source, policy, now, true)
  if not outcome then
    local vals = nil -- submit_one reads the record
    if view == false then vals = {} end -- no record
    local q = tonumber(ARGV[j + 1])
    local pk = 5 * q - 4
    local streams = blocks[q]
    if not streams then
      streams = {b = KEYS[pk], p = KEYS[pk + 4]}
      blocks[q] = streams
    end
    a.task, a.hist, a.streams, a.index, a.subjects, a.retry, a.watch = task, KEYS[k + 1], streams, KEYS[pk + 1],
      KEYS[k + 2], KEYS[pk + 2], KEYS[pk + 3]
    a.key, a.subject, a.source, a.policy, a.run_id = ARGV[j + 2], ARGV[j + 3], source, policy, ARGV[j + 6]
    a.stages, a.max_attempts, a.min_interval = ARGV[j + 7], ARGV[j + 8], tonumber(ARGV[j + 9])
    a.events, a.cancels = ARGV[3 + 2 * q], ARGV[4 + 2 * q]
    outcome, view = submit_one(a, vals)
  end
  if not view then view = view_reply(nil, redis.call('HMGET', task, unpack(VIEW_FIELDS)), 0) end
  out[#out + 1] = outcome
  out[#out + 1] = view
end
return out
