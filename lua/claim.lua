-- claim: a runner takes requests it took from a partition's lanes. For
-- each entry one decision — stale, busy, foreign or granted — and on a grant
-- it takes the lease with the key's next fencing token and enters the first
-- incomplete stage. Several entries of one partition go in one call.
-- KEYS[1] partition watch key (views are published only while it exists)
-- KEYS[2..5] the partition's queue keys (queue_at)
-- KEYS[6] partition's paused scopes (a set)   KEYS[7] partition's parked runs
--         (a sorted set, all scores 0, members "<scope> <subject>")
-- KEYS[5+3i] task record of entry i   KEYS[6+3i] its lease   KEYS[7+3i] its history   (i = 1..n)
-- ARGV[1] owner   ARGV[2] history cap   ARGV[3] events channel   ARGV[4] retention (ms)
-- ARGV[5] the runner's token floor (jobs/tokenfloor.go; '' none): a
--   grant's token is above it (lib/base.lua floored)
-- per entry i, ARGV[j+1 .. j+8] with j = 5 + 8(i-1):
--   lane ('p' or 'b': the lane the entry was taken from)   the entry   runId
--   source   lease ttl (ms)   follow-up run id (used if the claim ends the run
--   and a follow-up is queued)   the job's stages as this runner defines them
--   (comma list; '' when this runner does not define the job)   its maxAttempts
-- returns one reply per entry, in order:
--   {'ack'}                    entry was stale or the run ended here; nothing to do
--   {'busy', holder, pttl}     a live lease exists (or a retry is not due); the entry
--                              stays taken, reclaimable when the lease would expire
--   {'foreign', stage}         the run needs a stage (or job) this runner does not
--                              define: reclaimable at once by a runner that does
--   {'paused'}                 the run's scope is paused: the entry is acknowledged
--                              and the run parked until resume.lua re-queues it
--   {"granted US token US done US attempt US stages US sources US startedAt
--   US prevStatus US cursor"}  the lease is ours: the fields as one string
--                              (each element of a reply costs Redis ~700
--                              instructions), the cursor last as it may hold
--                              any byte; in a table, as every claim reply is,
--                              so that a read's reply tells entries (strings)
--                              from claims
-- The fencing counter is the record's 'token': a grant takes
-- max(token + 1, Redis TIME µs, ARGV[5] + 1) (next_token, floored), so no
-- separate counter key.
-- Cost of a grant: HMGET of 13 fields (CLAIM_READ; a retry's due time
-- and a crashed holder's owner are read only then), TIME, SET NX lease,
-- HSET of what changed, RPUSH (the entry stays in the taken set as the read
-- scored it: the holder's heartbeat moves it on); plus, once per call, one
-- EXISTS of the watch and paused keys (lib/queues.lua watch_and_paused: while
-- nobody watches and nothing is paused, the only cost of views and pause
-- on the hot path).
local now, now_us = clock()
now_us = floored(now_us, ARGV[5])
local watched, paused = watch_and_paused(KEYS[1], KEYS[6])
local c = {owner = ARGV[1], cap = ARGV[2], events = ARGV[3], watch = KEYS[1], watched = watched, retention = ARGV[4],
  q = queue_at(KEYS, 2), parked = KEYS[7], paused = paused, now = now, now_us = now_us}
local out = {}
for i = 1, (#KEYS - 7) / 3 do
  local k, j = 5 + 3 * i, 5 + 8 * (i - 1)
  out[i] = claim_entry(c, KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4],
    ARGV[j + 5], ARGV[j + 6], ARGV[j + 7], ARGV[j + 8])
end
return out
