-- limiter_acquire: requests of runs about to be claimed ask a limiter for
-- a start: a concurrency slot and a rate token (lib/limiters.lua). One
-- that is admitted gets a slot (number and fencing token) held for owner
-- until now + ttl; the claim of its run follows, and the run's heartbeat
-- renews the slot (limiter_renew.lua). One that is not waits: it joins the
-- limiter's waiting members (people first, then groups in turn, then by
-- arrival), and a slot freed later is reserved for it (lim_pump) by
-- whichever runner frees it or looks next. While members wait, a newcomer
-- waits behind them. The slots freed by the members that wait here are
-- used at once for the best waiting members, reserved for owner.
-- First it gives back the slots of runs that just finished on owner (as
-- limiter_release.lua does): a runner that runs the next request in the
-- slot of a finished run hands the slot over in one call.
-- On a single Redis server (not Cluster: the run's keys are in another
-- slot) a member admitted is also claimed here when the caller asks, as
-- claim.lua would (lib/claiming.lua claim_entry): one call instead of two.
-- A claim not granted gives the slot back, its rate refunded.
-- KEYS[1] the limiter's hash (its other keys are derived: lib/limiters.lua)
-- ARGV[1] configuration (lib/limiters.lua lim_open)   ARGV[2] owner
-- ARGV[3] slot ttl (ms)   ARGV[4] hold (ms, 0 none: limiter_release.lua)
-- ARGV[5] for claims: history cap US retention (ms); '' when none is asked
-- ARGV[6] the runner's token floor (jobs/tokenfloor.go; '' none): slot
--         tokens, and the token of a run
--         claimed here gets a token above it (lib/base.lua floored)
-- ARGV[7] R, the slots given back, then 3R values: slot number, token,
--         member
-- then per member 4 values: the member (a request entry), its lane ('p'
-- people, 'b' bulk), its fair-share group, and '' or, to claim it when
-- admitted, its partition's hash tag US the job's stages US maxAttempts
-- US lease TTL (ms) — the run's record, lease and history keys derived
-- under that tag (single server only)
-- returns {results, reserved, look again in (ms, by Redis
--   time: a runner's clock may differ; 0 when none waits), waiting}
--   results: per member {'g', slot, token} admitted (slot -1 without a
--   concurrency), {'c', slot, token, claim reply} admitted and claimed,
--   {'n', claim reply} admitted but not granted (the slot given back),
--   or {'w', reason, at}: waiting; reason 'full', 'rate',
--   'held' (holdOnRetryAfter) or 'turn' (others wait first), at when to
--   look again (ms)
--   reserved: {member, slot, token} for each waiting member given a slot
-- Cost of an admitted start: HMGET, TIME, ZRANGE, ZADD, HSET of the
-- holder, HSET of the token (and rate); a member that waits: HSETNX,
-- HSET of the count, HINCRBY of the order, ZADD (and, a group's first,
-- ZCARD and RPUSH).
local l = lim_open(KEYS[1], ARGV[1], ARGV[3], ARGV[6])
local owner = ARGV[2]
lim_hold(l, tonum(ARGV[4]))
local rel_end = 7 + 3 * tonum(ARGV[7])
for j = 8, rel_end, 3 do lim_release(l, ARGV[j], ARGV[j + 1], ARGV[j + 2], owner, false) end
local res = {}
local free = 0
local waiting = l.waiting
local parts = {} -- claim contexts by partition tag
for j = rel_end + 1, #ARGV, 4 do
  local member, lane, group, spec = ARGV[j], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3]
  local i, why, at = nil, 'turn', l.now
  if waiting == 0 then i, why, at = lim_blocked(l) end
  if i and spec ~= '' then
    local token = lim_take(l, i, member, owner, 'h', lane, group)
    local d = conf_fields(spec)
    local tag = d[1]
    local c = parts[tag]
    if not c then
      local cc = conf_fields(ARGV[5])
      local part = part_of(tag)
      local watched, paused = watch_and_paused(part.watch, part.paused)
      c = {owner = owner, cap = cc[1], events = part.events, watch = part.watch, watched = watched, retention = cc[2],
        q = part.q, parked = part.parked, paused = paused, now = l.ms, now_us = floored(l.us, ARGV[6])}
      parts[tag] = c
    end
    local run_id, key, _, source = entry_parts(member)
    local claim = {'ack'}
    if run_id then claim = claim_in_slot(c, tag, member, run_id, key, source, d[4], '', d[2], d[3]) end
    if ltype(claim[1]) == 'string' and ssub(claim[1], 1, 7) == 'granted' then
      res[#res + 1] = {'c', tonum(i), token, claim}
    else
      lim_release(l, i, token, member, owner, true)
      free = free + 1
      res[#res + 1] = {'n', claim}
    end
  elseif i then
    res[#res + 1] = {'g', tonum(i), lim_take(l, i, member, owner, 'h', lane, group)}
  else
    if waiting > 0 and why == 'turn' then
      local w2, at2 = lim_reason(l)
      if w2 then why, at = w2, at2 end
    end
    lim_wait(l, member, lane, group, false)
    waiting = l.waiting
    free = free + 1
    res[#res + 1] = {'w', why, tostring(at)}
  end
end
local reserved = {}
local next_at, left = lim_pump(l, owner, free, reserved)
lim_close(l)
return {res, reserved, lim_in(l, next_at), left}
