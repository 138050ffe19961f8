-- read_next: take up to n entries of one partition, from the preferred lane
-- first and from the other only for what is left, so a runner's free slots
-- go to people's requests before bulk work (lib/queues.lua read_lanes), and claim
-- each for this runner in the same call (lib/claiming.lua claim_entry, with this
-- runner's definition of the entry's job; a job it does not define is
-- answered 'foreign' and left, taken and reclaimable at once, to a runner
-- that defines it). A run picked up by an idle runner thus costs one
-- call after the bell wakes it. (Blocking pops cannot run in a script; an
-- idle runner blocks on the partition's bell, then calls this.)
-- KEYS[1] the partition's bulk lane: its hash tag (tag_of) names the
--         partition's other keys (queue_of; watch, paused scopes, parked
--         runs, events channel) and the entries' keys, all in its slot
--         (declared, they cost 7 arguments more: ~900 instructions each)
-- ARGV[1] n   ARGV[2] the preferred lane's letter ('p' or 'b')
-- ARGV[3] what is constant for this runner, US-separated (lib/base.lua
--   conf_fields; jobs.readConf): owner, reclaim idle (ms: the entries
--   become reclaimable that long from now), history cap, retention (ms),
--   J, the number of jobs this runner defines, then per job 5 fields:
--   scope, stages (comma list), maxAttempts, lease TTL (ms), and 'L' when
--   the job has limiters (its entries are taken, answered {'limited'} and
--   not claimed: the runner asks the limiters first, jobs.admitAndStart)
-- (A claim that ends a run with a queued follow-up derives the follow-up's
-- run id: lib/claiming.lua claim_ending.)
-- returns the entries taken, in order, each followed by its claim reply
-- (see claim.lua). The entries' record, lease and history keys are derived
-- from the entries in the partition's slot, as in finish.lua.
local n = small_num(ARGV[1])
local now, now_us = clock()
local tag = tag_of(KEYS[1])
local part = part_of(tag)
local q = part.q
local cf = conf_fields(ARGV[3])
local taken = read_lanes({}, q, ARGV[2], n, now + conf_num(cf[2]))
if #taken == 0 then return taken end
-- the jobs' definitions by scope (the index of its first field), made once
-- per configuration value and kept on it
local defs = cf.defs
if not defs then
  defs = {}
  local j = 6
  for _ = 1, small_num(cf[5]) do
    defs[cf[j]] = j
    j = j + 5
  end
  cf.defs = defs
end
local watch = part.watch
local watched, paused = watch_and_paused(watch, part.paused)
local c = {owner = cf[1], cap = cf[3], events = part.events, watch = watch, watched = watched, retention = cf[4],
  q = q, parked = part.parked, paused = paused, now = now, now_us = now_us}
local out = {}
for i = 1, #taken do
  local e = taken[i]
  out[#out + 1] = e
  local run_id, key, scope, source = entry_parts(e)
  if run_id then -- tasklease's entry (the caller drops others)
    local d = defs[scope]
    -- A job this runner does not define is answered foreign (or busy, or
    -- ended by its cancel flag), never granted: the lease claim_entry takes
    -- before deciding is dropped in this call, so any valid TTL does. The
    -- reclaim idle is one: a TTL of 0 made SET raise and the whole call
    -- abort after the entries before it were granted, leaving their leases
    -- to expire unstarted.
    if d and cf[d + 4] == 'L' then
      out[#out + 1] = {'limited'}
    else
      local stages, max_attempts, ttl = '', '1', cf[2]
      if d then stages, max_attempts, ttl = cf[d + 1], cf[d + 2], cf[d + 3] end
      out[#out + 1] = claim_in_slot(c, tag, e, run_id, key, source, ttl, '', stages, max_attempts)
    end
  end
end
return out
