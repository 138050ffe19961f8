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
-- ARGV[4] the runner's token floor (jobs/tokenfloor.go; '' none): a
--   grant's token is above it (lib/base.lua floored)
-- (A claim that ends a run with a queued follow-up derives the follow-up's
-- run id: lib/claiming.lua claim_ending.)
-- returns the entries taken, in order, each followed by its claim reply
-- (see claim.lua). The entries' record, lease and history keys are derived
-- from the entries in the partition's slot, as in finish.lua.
local n = small_num(ARGV[1])
local now, now_us = clock()
now_us = floored(now_us, ARGV[4])
local tag = tag_of(KEYS[1])
local part = part_of(tag)
local q = part.q
local cf = conf_fields(ARGV[3])
local taken = read_lanes({}, q, ARGV[2], n, now + conf_num(cf[2]), now)
if #taken == 0 then return taken end
return claim_read(cf, tag, part, taken, now, now_us)
