-- cron_adopt: take over a schedule's unfinished fan-out under term ARGV[2]
-- to resume it: the same leader after an error, or a successor after a
-- crash (docs/cron.md). From then on only ARGV[2] can advance it
-- (cron_progress.lua), so a deposed leader that is still running cannot
-- move the cursor. A fan-out that started more than ARGV[4] ms ago is not
-- resumed: it is marked done and abandoned (the next occurrence covers its
-- subjects). When the subjects spec differs from ARGV[3] (the schedule's
-- scope or subject list changed in a deploy) the position restarts from
-- the beginning: subjects the occurrence already reached then answer
-- 'duplicate', so nobody gets a second request.
-- KEYS[1] the schedule's fan-out state (hash, see cron_claim.lua)
-- ARGV[1] owner   ARGV[2] term   ARGV[3] subjects spec
-- ARGV[4] resume bound (ms since the fan-out started)
-- returns {'none'} | {'done', occ} | {'fenced', term}
--   | {'abandoned', occ, submitted, duplicates}
--   | {'adopted', occ, part, cursor, index, submitted, duplicates, batches, restarted (0|1)}
local st = rcall('HMGET', KEYS[1], 'occ', 'term', 'done', 'spec', 'part', 'cursor', 'index',
  'submitted', 'duplicates', 'batches', 'startedAt')
if not st[1] then return {'none'} end
if st[3] ~= '0' then return {'done', st[1]} end
if tonum(st[2]) > tonum(ARGV[2]) then return {'fenced', st[2]} end
local now = now_ms()
if now - tonum(st[11]) > tonum(ARGV[4]) then
  rcall('HSET', KEYS[1], 'done', '1', 'abandoned', '1', 'finishedAt', tok_str(now), 'updatedAt', tok_str(now))
  return {'abandoned', st[1], st[8], st[9]}
end
local restarted = '0'
if st[4] ~= ARGV[3] then
  restarted = '1'
  st[5], st[6], st[7] = '0', '0', '0'
  rcall('HSET', KEYS[1], 'spec', ARGV[3], 'part', '0', 'cursor', '0', 'index', '0')
end
if st[2] ~= ARGV[2] then
  rcall('HINCRBY', KEYS[1], 'resumes', 1)
end
rcall('HSET', KEYS[1], 'term', ARGV[2], 'owner', ARGV[1], 'updatedAt', tok_str(now))
return {'adopted', st[1], st[5], st[6], st[7], st[8], st[9], st[10], restarted}
