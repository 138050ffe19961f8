-- claim: a runner takes a request from the stream. One script decides
-- whether the entry is stale, busy, foreign or granted, and on a grant takes
-- the lease (next fencing token) and enters the first incomplete stage.
-- KEYS[1] task record   KEYS[2] lease   KEYS[3] fence counter
-- KEYS[4] request stream   KEYS[5] history   KEYS[6] partition index
-- KEYS[7] partition watch key (views are published only while it exists)
-- ARGV[1] entry id   ARGV[2] entry runId   ARGV[3] entry source
-- ARGV[4] owner (and consumer name)   ARGV[5] lease ttl (ms)   ARGV[6] group
-- ARGV[7] history cap   ARGV[8] events channel   ARGV[9] retention (ms)
-- ARGV[10] reclaim idle (ms): min idle time after which entries are reclaimed
-- ARGV[11] follow-up run id (used if the claim ends the run and a follow-up is queued)
-- ARGV[12] the job's stages as this runner defines them (comma list; '' when
--          this runner does not define the job at all)
-- ARGV[13] the job's maxAttempts here (for a follow-up started by this claim)
-- ARGV[14] fence counter expiry (ms)
-- returns {'ack'}                    entry was stale or the run ended here; nothing to do
--         {'busy', holder, pttl}     a live lease exists (or a retry is not due); entry left pending
--         {'foreign', stage}         the run needs a stage (or job) this runner does not
--                                    define: left pending for a runner that does
--         {'granted', token, done, cursor, attempt, stages, sources, startedAt, prevStatus}
local task, lease_key, stream, hist = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local entry_id, run_id, source, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local group, cap = ARGV[6], ARGV[7]
local rec = redis.call('HMGET', task, 'runId', 'status', 'cancel', 'nextAttemptAt', 'attempt',
  'maxAttempts', 'owner', 'token', 'sources', 'stages', 'done', 'waiting')
local status = rec[2]
if rec[1] ~= run_id or not (status == 'queued' or status == 'running' or status == 'retrying') then
  ack_entry(stream, group, entry_id)
  return {'ack'}
end

local holder = redis.call('GET', lease_key)
if holder then
  local pttl = redis.call('PTTL', lease_key)
  -- Make the entry reclaimable the moment the lease would expire, not a
  -- whole idle period later; a live holder's heartbeat takes it back.
  local idle = tonumber(ARGV[10]) - pttl
  if idle < 0 then idle = 0 end
  redis.call('XCLAIM', stream, group, owner, 0, entry_id, 'IDLE', idle, 'JUSTID')
  return {'busy', holder, pttl}
end

local now = now_ms()
local c = {task = task, stream = stream, hist = hist, index = KEYS[6], group = group, cap = cap,
  channel = ARGV[8], retention = ARGV[9], next_run_id = ARGV[11], stages = ARGV[12],
  max_attempts = ARGV[13], now = now}
-- A cancel (or replace) ends the run at once, even during its retry backoff.
if rec[3] == '1' then
  finish_terminal(c, 'cancelled', 'cancelled')
  publish_view(task, ARGV[8], KEYS[7])
  return {'ack'}
end
if status == 'retrying' and tonumber(rec[4]) and tonumber(rec[4]) > now then
  return {'busy', '', tonumber(rec[4]) - now}
end

-- Rolling deploys: a run whose remaining stages this runner does not
-- define is left to a runner that does, never failed. The entry stays
-- pending and immediately reclaimable; the view says what it waits for.
local missing = nil
if ARGV[12] == '' then
  missing = ''
else
  local defined = {}
  for _, s in ipairs(split(ARGV[12], ',')) do defined[s] = true end
  local run_stages = split(rec[10], ',')
  for i = (tonumber(rec[11]) or 0) + 1, #run_stages do
    if not defined[run_stages[i]] then missing = run_stages[i]; break end
  end
end
if missing then
  local why
  if missing == '' then
    why = 'waiting for a runner that defines this job (' .. owner .. ' does not)'
  else
    why = 'waiting for a runner that defines stage ' .. missing .. ' (' .. owner .. ' does not)'
  end
  redis.call('XCLAIM', stream, group, owner, 0, entry_id, 'IDLE', ARGV[10], 'JUSTID')
  if rec[12] ~= why then
    redis.call('HSET', task, 'waiting', why)
    publish_view(task, ARGV[8], KEYS[7])
  end
  return {'foreign', missing}
end

local attempt, max_attempts = tonumber(rec[5]) or 0, tonumber(rec[6]) or 1
if status == 'running' then
  -- The previous holder's lease expired without a finish: it crashed,
  -- paused or was cut off.
  hist_add(hist, cap, now, 'lease-lost', run_id, {'owner', rec[7] or '', 'fencingToken', rec[8] or ''})
  if attempt >= max_attempts then
    finish_terminal(c, 'failed', 'lease expired on the last attempt (' .. attempt .. ' of ' .. max_attempts .. ')')
    publish_view(task, ARGV[8], KEYS[7])
    return {'ack'}
  end
end

local token = lease_grant(lease_key, KEYS[3], owner, ARGV[5], ARGV[14])
local done, stage, cursor, attempt_now = cp_begin(task, run_id, rec[10], owner, token, now)
local sources = add_source(rec[9], source)
redis.call('HSET', task, 'entry', entry_id, 'sources', sources)
-- 'recovered' is reserved for crash recovery (the lease expired while
-- running); a retry or a handed-back run is 'started' again, with its
-- recovery mode as the outcome.
local ev = {'source', source, 'stage', stage, 'owner', owner, 'fencingToken', tok_str(token)}
if attempt_now > 1 or done > 0 or cursor ~= '' then
  ev[#ev + 1] = 'outcome'
  ev[#ev + 1] = recovery_mode(done, cursor, #split(rec[10], ','))
end
hist_add(hist, cap, now, status == 'running' and 'recovered' or 'started', run_id, ev)
publish_view(task, ARGV[8], KEYS[7])
local started = redis.call('HGET', task, 'startedAt')
return {'granted', token, done, cursor, attempt_now, rec[10], sources, started, status}
