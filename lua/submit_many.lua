-- submit_many: route one request per subject of one scope, all in one
-- partition, through submit_one (lib/submitting.lua) — the same rules as submit.lua,
-- one script call for a whole batch (cron fan-outs, bulk "sync everyone").
-- With an occurrence, each key records it (field occ_field = occ, unix
-- seconds) and a repeat of it — or of an older one — is answered
-- "duplicate" and writes nothing,
-- so a fan-out resumed after a crash gives every subject exactly one request.
-- KEYS[1..4] the partition's queue keys (lib/queues.lua queue_at)
-- KEYS[5] partition index   KEYS[6] partition subjects of the scope (zset)
-- KEYS[7] partition retry queue   KEYS[8] partition watch key
-- KEYS[7+2i] task record of subject i   KEYS[8+2i] its history   (i = 1..n)
-- ARGV[1] scope   ARGV[2] source   ARGV[3] policy   ARGV[4] stages (comma list)
-- ARGV[5] maxAttempts   ARGV[6] minInterval (ms), with a debounced
--   job's delay (lib/submitting.lua request_timing; jobs.appendTiming); a
--   "|<group>" there would give every run the batch starts that
--   fair-share group (jobs sends none: the runs it starts have no group,
--   and one a previous run left on a record is dropped, as in submit.lua)
-- ARGV[7] history cap
-- ARGV[8] events channel   ARGV[9] cancel channel
-- ARGV[10] retention (ms)   ARGV[11] occurrence field ('' for none)
-- ARGV[12] occurrence value
-- ARGV[11+2i] subject i   ARGV[12+2i] new run id for subject i
-- returns the outcomes, one per subject, in order
local now = now_ms()
local out = {}
local n = (#KEYS - 8) / 2
-- submit_one's arguments, one table for the batch (see submit.lua)
local a = {q = queue_at(KEYS, 1), index = KEYS[5], subjects = KEYS[6], part = {events = ARGV[8], watch = KEYS[8]},
  tag = tag_of(KEYS[7]), -- a replace names the retry queue (KEYS[7]) and cancel channel (ARGV[9]) from it
  source = ARGV[2], policy = ARGV[3], stages = ARGV[4], max_attempts = ARGV[5],
  cap = ARGV[7], retention = ARGV[10],
  occ_field = ARGV[11], occ = ARGV[12], now = now}
a.min_interval, a.not_before, a.debounce_max, a.group = request_timing(ARGV[6], now)
local ff = fast_of(ARGV[2], ARGV[3], ARGV[2] .. ' ' .. ARGV[3])
for i = 1, n do
  local subject = ARGV[11 + 2 * i]
  local vals = nil
  if ARGV[11] == '' then -- without an occurrence a repeat can take the fast path
    local outcome, exists = submit_fast(KEYS[7 + 2 * i], ff, now, false)
    out[i] = outcome
    if exists == false then vals = {} end
  end
  if not out[i] then
    a.task, a.hist, a.key, a.subject, a.run_id = KEYS[7 + 2 * i], KEYS[8 + 2 * i], subject .. '|' .. ARGV[1],
      subject, ARGV[12 + 2 * i]
    out[i] = submit_one(a, vals)
  end
end
return out
