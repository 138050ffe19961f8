-- cron_progress: record one fan-out batch and move the cursor past it,
-- fenced by the leadership term (docs/cron.md). The caller submits the batch
-- first (SubmitMany with the occurrence) and records it after, so a crash
-- in between re-submits the batch, which the occurrence answers
-- 'duplicate'. Refused unless the state is still this occurrence's and
-- ARGV[1] is the term that claimed or last adopted it: a deposed leader
-- cannot move the cursor. The write is also a compare-and-set on the
-- position (ARGV[3..5] -> ARGV[6..8]): repeated after a lost reply, it
-- answers 'recorded' and counts nothing twice. Each write refreshes the
-- state's expiry.
-- KEYS[1] the schedule's fan-out state (hash, see cron_claim.lua)
-- ARGV[1] term   ARGV[2] occurrence (unix seconds)
-- ARGV[3] partition   ARGV[4] ZSCAN cursor   ARGV[5] list index (the batch's start)
-- ARGV[6] partition   ARGV[7] ZSCAN cursor   ARGV[8] list index (after the batch)
-- ARGV[9] requests the batch submitted   ARGV[10] duplicates in the batch
-- ARGV[11] 1 when the batch was the last one, else 0   ARGV[12] expiry of the state (ms)
-- returns {'ok', submitted, duplicates} (the occurrence's totals)
--   | {'recorded', submitted, duplicates} (this write had landed already)
--   | {'done'} (finished already under this term) | {'fenced', term, occ}
--   | {'moved', partition, cursor, index} (the cursor is elsewhere) | {'gone'}
local st = rcall('HMGET', KEYS[1], 'occ', 'term', 'done', 'part', 'cursor', 'index', 'submitted', 'duplicates')
if not st[1] then return {'gone'} end
if st[1] ~= ARGV[2] or st[2] ~= ARGV[1] then return {'fenced', st[2] or '', st[1]} end
if st[3] ~= '0' then return {'done'} end
local at_from = st[4] == ARGV[3] and st[5] == ARGV[4] and st[6] == ARGV[5]
if not at_from then
  if st[4] == ARGV[6] and st[5] == ARGV[7] and st[6] == ARGV[8] then
    return {'recorded', st[7], st[8]}
  end
  return {'moved', st[4], st[5], st[6]}
end
local now = tok_str(now_ms())
rcall('HSET', KEYS[1], 'part', ARGV[6], 'cursor', ARGV[7], 'index', ARGV[8], 'updatedAt', now)
local sub = rcall('HINCRBY', KEYS[1], 'submitted', ARGV[9])
local dup = rcall('HINCRBY', KEYS[1], 'duplicates', ARGV[10])
rcall('HINCRBY', KEYS[1], 'batches', 1)
if ARGV[11] == '1' then
  rcall('HSET', KEYS[1], 'done', '1', 'finishedAt', now)
end
rcall('PEXPIRE', KEYS[1], ARGV[12])
return {'ok', sub, dup}
