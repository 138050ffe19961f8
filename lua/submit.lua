-- submit: route TaskStartRequests through the registry (submit_one in
-- lib/submitting.lua), one or many per call: concurrent submits of a process are sent
-- together, and on a single Redis (not Cluster) the requests of several
-- partitions share one call, so the fixed cost of a script call is paid
-- once per batch. If a key has no active run a queued run is created and
-- its request appended to the partition's list of its lane; otherwise the
-- conflict policy decides: join, skip, queue (one coalesced follow-up) or
-- replace.
-- KEYS, per request i (1..n): its task record (traced: KEYS[3i-2] the
--   record, KEYS[3i-1] the key's follow-up trace links (the trace contexts
--   of requests merged into its next run), KEYS[3i] the trace links of the
--   run this request would start)
-- ARGV[1] history cap   ARGV[2] retention (ms)   ARGV[3] '1' when traced
--   (the per-request layout of KEYS above), else '0'
-- ARGV[3+i] request i, one argument (jobs.requestArg):
--   "<policy letter><source letter><new run id>US<stages (comma list)>US
--   <maxAttempts>US<minInterval (ms, 0 = none)>[+<delay ms>[~<debounceMax
--   ms>]][@<not before, ms>][|<group>]" (only for a delayed request; ~ for a
--   debounced one; |<group> only for a request that names a fair-share
--   group, lib/submitting.lua request_timing), traced followed by
--   US<the request's W3C traceparent ('' for none)>; the letters are the
--   first of the names (POLICY_OF, SOURCE_OF). One argument instead of six:
--   a repeat (submit_fast) reads only the two letters, and Redis makes a
--   Lua string of every argument (~900 instructions each).
-- Everything else is derived from a record's name "<tag>:task:<key>"
-- (lib/queues.lua tag_of; TestLuaDerivesKeyspaceNames pins the names): its task
-- key, subject and scope, its history, and its partition's lanes, bell,
-- taken set, index, retry queue, watch key, subjects of the scope and
-- events and cancel channels, all in the record's slot. (Declared, a
-- request cost 5 arguments more and a call 9 more per partition: ~900
-- Redis instructions each.) On a single Redis one call may carry
-- requests of several partitions; on Cluster a call holds one partition's.
-- A traced request answered queued (or replaced while the run executes)
-- leaves its trace context in the follow-up links, in this script, so the
-- finish that starts the follow-up (which renames them to its run's links)
-- cannot miss it; started and joined requests are linked by the caller.
-- returns per request: outcome, view ("<stamp>RS<view>": the cached view's
--   stamp, or none, then VIEW_FIELDS US-separated, see view_stamp and
--   view_reply; for started, only the server time in ms: the caller knows
--   the rest)
--   outcome: started | joined | queued | skipped | replaced | throttled;
--   queued and replaced are followed by a space and the id of the run
--   that serves the request, the follow-up (fixed by the request that
--   queued it, lib/submitting.lua follow_up_run; its own id when the
--   replace started it here)
-- Cost: a repeated join or skip is one HMGET of 6 fields and one HSET of a
-- counter (the view comes from the record's cache, see submit_fast; plus
-- TIME once per call); a new run is that HMGET, XADD, HSET, RPUSH, ZADD
-- index (and the subjects ZADD for requests that are not schedule), EXISTS
-- watch; ringing the bell (LLEN, RPUSH) when the lane was empty. A request
-- that names a group and starts a run adds one HSET of the record's group
-- field (and its bytes to the argument); one that names none adds nothing
-- but, on a record that had a run before, the field 'group' in the HMGET
-- submit_one reads it with — and an HDEL only when a previous run had a
-- group. Joins never read or write it.
local now = now_ms()
local traced = ARGV[3] == '1'
local kr = traced and 3 or 1
local parts = {} -- per partition tag: its lanes, index and publish state, derived once per call
local out = {}
-- submit_one's arguments: one table for the call, its per-request fields
-- rewritten (a table per request cost more than the rest of a new run's Lua)
local a = {cap = ARGV[1], retention = ARGV[2], occ_field = '', occ = '', now = now}
for i = 1, #KEYS / kr do
  local k, req = kr * (i - 1) + 1, ARGV[3 + i]
  local task = KEYS[k]
  local pb, sb = sbyte(req, 1, 2)
  local ff = fast_of(SOURCE_OF[sb], POLICY_OF[pb], pb * 256 + sb)
  local outcome, view = submit_fast(task, ff, now, true)
  if not outcome then
    local vals = nil -- submit_one reads the record
    if view == false then vals = {} end -- no record
    local tag = tag_of(task)
    local part = parts[tag]
    if not part then
      -- (the retry queue and cancel channel only a replace needs are named there)
      local names = part_of(tag) -- publish's state (watched) is this call's: a table of its own
      part = {q = names.q, index = names.index, events = names.events, watch = names.watch}
      parts[tag] = part
    end
    local key = ssub(task, #tag + 7)
    local i1 = sfind(req, US, 3, true)
    local i2 = sfind(req, US, i1 + 1, true)
    local i3 = sfind(req, US, i2 + 1, true)
    local i4 = traced and sfind(req, US, i3 + 1, true)
    a.task, a.hist, a.q, a.index, a.part = task, tag .. ':history:' .. key, part.q, part.index, part
    a.tag, a.key, a.source, a.policy, a.run_id = tag, key, SOURCE_OF[sb], POLICY_OF[pb], ssub(req, 3, i1 - 1)
    a.stages, a.max_attempts = ssub(req, i1 + 1, i2 - 1), ssub(req, i2 + 1, i3 - 1)
    -- minInterval, a delayed request's delay and the request's group (lib/submitting.lua request_timing)
    a.min_interval, a.not_before, a.debounce_max, a.group = request_timing(ssub(req, i3 + 1, i4 and i4 - 1 or -1), now)
    if traced then a.links_next, a.links_new, a.tp = KEYS[k + 1], KEYS[k + 2], ssub(req, i4 + 1) end
    local served
    outcome, view, served = submit_one(a, vals)
    if served then outcome = outcome .. ' ' .. served end
  end
  if not view then view = '\30' .. view_reply(nil, rcall('HMGET', task, unpk(VIEW_FIELDS)), 0) end
  out[#out + 1] = outcome
  out[#out + 1] = view
end
return out
