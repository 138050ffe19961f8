-- cron_claim: claim one occurrence of a schedule and open its fan-out state
-- in one step (docs/cron.md). The fired key is the occurrence's idempotency
-- key (value: the claiming owner); the state hash is the fan-out's cursor,
-- advanced only under the claimer's term (cron_progress.lua) and taken
-- over by a newer leader to resume it (cron_adopt.lua). Both keys share the
-- schedule's hash tag "{<prefix>:cron:<name>}" (Redis Cluster safe).
-- Nothing is written, and the answer says why, when:
--   * the fired key exists: 'duplicate' (someone fired it) -- unless it is
--     this very claim (same claim id, fan-out unfinished), retried after
--     its reply was lost: 'claimed' again;
--   * the state was written under a newer term: 'fenced' (this caller is a
--     deposed leader);
--   * the state holds this or a later occurrence: 'duplicate' (an
--     occurrence is never fired after a later one: a task record remembers
--     only a schedule's latest occurrence);
--   * the state holds an unfinished fan-out: 'busy' (resume it first).
-- State fields: occ, claim, owner, term, spec, part, cursor, index,
-- submitted, duplicates, batches, done (0|1), startedAt, updatedAt,
-- finishedAt (ms, Redis time), resumes, abandoned.
-- The state it replaces (the previous occurrence, finished or abandoned)
-- is archived first: a JSON object of its fields appended to KEYS[3], the
-- schedule's recent fan-outs, trimmed to ARGV[7] entries and expiring
-- with the state. (Costs a claim an HGETALL and an RPUSH: once per
-- occurrence, not per subject.)
-- KEYS[1] the occurrence's fired key   KEYS[2] the schedule's fan-out state (hash)
-- KEYS[3] the schedule's recent fan-outs (list, oldest first)
-- ARGV[1] owner   ARGV[2] term   ARGV[3] occurrence (unix seconds)
-- ARGV[4] expiry of both keys (ms)   ARGV[5] claim id (unique per fire)
-- ARGV[6] subjects spec (fingerprint of the schedule's scope and subjects)
-- ARGV[7] recent fan-outs kept
-- returns {'claimed'} | {'duplicate', holder} | {'fenced', term} | {'busy', occurrence}
local st = rcall('HMGET', KEYS[2], 'occ', 'term', 'done', 'claim', 'owner')
local holder = rcall('GET', KEYS[1])
if holder then
  if st[1] == ARGV[3] and st[4] == ARGV[5] and st[3] == '0' then return {'claimed'} end
  return {'duplicate', holder}
end
if st[2] and tonum(st[2]) > tonum(ARGV[2]) then return {'fenced', st[2]} end
if st[1] and tonum(st[1]) >= tonum(ARGV[3]) then return {'duplicate', st[5] or ''} end
if st[3] == '0' then return {'busy', st[1]} end
local now = tok_str(now_ms())
rcall('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
if st[1] then
  local prev, flat = {}, rcall('HGETALL', KEYS[2])
  for i = 1, #flat, 2 do
    if flat[i] ~= 'claim' and flat[i] ~= 'spec' then prev[flat[i]] = flat[i + 1] end
  end
  local n = rcall('RPUSH', KEYS[3], cjson.encode(prev))
  if n > tonum(ARGV[7]) then rcall('LTRIM', KEYS[3], -tonum(ARGV[7]), -1) end
  rcall('PEXPIRE', KEYS[3], ARGV[4])
end
rcall('DEL', KEYS[2])
rcall('HSET', KEYS[2], 'occ', ARGV[3], 'claim', ARGV[5], 'owner', ARGV[1], 'term', ARGV[2],
  'spec', ARGV[6], 'part', '0', 'cursor', '0', 'index', '0', 'submitted', '0', 'duplicates', '0',
  'batches', '0', 'done', '0', 'startedAt', now, 'updatedAt', now, 'resumes', '0')
rcall('PEXPIRE', KEYS[2], ARGV[4])
return {'claimed'}
