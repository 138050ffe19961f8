-- submit: route TaskStartRequests through the registry (submit_one in
-- lib.lua), one or many per call: concurrent submits of a process are sent
-- together, and on a single Redis (not Cluster) the requests of several
-- partitions share one call, so the fixed cost of a script call is paid
-- once per batch. If a key has no active run a queued run is created and
-- its request appended to the partition's list of its lane; otherwise the
-- conflict policy decides: join, skip, queue (one coalesced follow-up) or
-- replace.
-- KEYS, per partition block q (1..np), KEYS[7q-6 .. 7q]: the partition's
--   queue keys (bulk list, people list, bell, taken: lib.lua queue_at),
--   index, retry queue, watch key (views are published only while it exists)
-- then per request i (1..n), with b = 7np and kr = 3 (5 when traced):
--   KEYS[b+kr(i-1)+1] task record   KEYS[b+kr(i-1)+2] history
--   KEYS[b+kr(i-1)+3] subjects of the request's scope (zset)
--   traced: KEYS[b+kr(i-1)+4] the key's follow-up trace links (the trace
--   contexts of requests merged into its next run)   KEYS[b+kr(i-1)+5] the
--   trace links of the run this request would start
-- ARGV[1] history cap   ARGV[2] retention (ms)   ARGV[3] np
-- ARGV[4] '1' when traced (tracing on: the per-request layout above), else '0'
-- per partition block q: ARGV[3+2q] events channel   ARGV[4+2q] cancel channel
-- per request i, ARGV[j+1 .. j+ar] with j = 4 + 2np + ar(i-1), ar = 9 (10
--   when traced): partition block q, task key, subject, source, policy, new
--   run id, stages (comma list), maxAttempts, minInterval (ms, 0 = none),
--   traced: the request's W3C traceparent ('' for none)
-- A traced request answered queued (or replaced while the run executes)
-- leaves its trace context in the follow-up links, in this script, so the
-- finish that starts the follow-up (which renames them to its run's links)
-- cannot miss it; started and joined requests are linked by the caller.
-- returns per request: outcome, view ("<stamp>RS<view>": the cached view's
--   stamp, or none, then VIEW_FIELDS US-separated, see view_stamp and
--   view_reply; for started, only the server time in ms: the caller knows
--   the rest)
--   outcome: started | joined | queued | skipped | replaced | throttled
-- Cost: a repeated join or skip is one HMGET of 6 fields and one HSET of a
-- counter (the view comes from the record's cache, see submit_fast; plus
-- TIME once per call); a new run is that HMGET, XADD, HSET, RPUSH, ZADD
-- index (and the subjects ZADD for requests that are not schedule), EXISTS
-- watch; ringing the bell (LLEN, RPUSH) when the lane was empty.
local now = now_ms()
local np = tonum(ARGV[3])
local traced = ARGV[4] == '1'
local kr, ar = 3, 9
if traced then kr, ar = 5, 10 end
local base_k, base_a = 7 * np, 4 + 2 * np
local blocks = {}
local pubs = {} -- per partition block: its publisher (one EXISTS watch per call)
local out = {}
-- submit_one's arguments: one table for the call, its per-request fields
-- rewritten (a table per request cost more than the rest of a new run's Lua)
local a = {cap = ARGV[1], retention = ARGV[2], occ_field = '', occ = '', now = now}
for i = 1, (#KEYS - base_k) / kr do
  local k, j = base_k + kr * (i - 1) + 1, base_a + ar * (i - 1)
  local task, source, policy = KEYS[k], ARGV[j + 4], ARGV[j + 5]
  local outcome, view = submit_fast(task, source, policy, now, true)
  if not outcome then
    local vals = nil -- submit_one reads the record
    if view == false then vals = {} end -- no record
    local q = tonum(ARGV[j + 1])
    local pk = 7 * q - 6
    local queue = blocks[q]
    if not queue then
      queue = queue_at(KEYS, pk)
      blocks[q] = queue
      pubs[q] = publisher(ARGV[3 + 2 * q], KEYS[pk + 6])
    end
    a.task, a.hist, a.q, a.index, a.subjects, a.retry, a.pub = task, KEYS[k + 1], queue, KEYS[pk + 4],
      KEYS[k + 2], KEYS[pk + 5], pubs[q]
    a.key, a.subject, a.source, a.policy, a.run_id = ARGV[j + 2], ARGV[j + 3], source, policy, ARGV[j + 6]
    a.stages, a.max_attempts, a.min_interval = ARGV[j + 7], ARGV[j + 8], tonum(ARGV[j + 9])
    a.cancels = ARGV[4 + 2 * q]
    if traced then a.links_next, a.links_new, a.tp = KEYS[k + 3], KEYS[k + 4], ARGV[j + 10] end
    outcome, view = submit_one(a, vals)
  end
  if not view then view = '\30' .. view_reply(nil, rcall('HMGET', task, unpk(VIEW_FIELDS)), 0) end
  out[#out + 1] = outcome
  out[#out + 1] = view
end
return out
