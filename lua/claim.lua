-- claim: a runner takes requests it took from a partition's lanes. For
-- each entry one decision — stale, busy, foreign or granted — and on a grant
-- it takes the lease with the key's next fencing token and enters the first
-- incomplete stage. Several entries of one partition go in one call.
-- KEYS[1] partition index   KEYS[2] partition watch key (views are published
--         only while it exists)   KEYS[3..6] the partition's queue keys (queue_at)
-- KEYS[7] partition's paused scopes (a set)   KEYS[8] partition's parked runs
--         (a sorted set, all scores 0, members "<scope> <subject>")
-- KEYS[6+3i] task record of entry i   KEYS[7+3i] its lease   KEYS[8+3i] its history   (i = 1..n)
-- ARGV[1] owner   ARGV[2] history cap   ARGV[3] events channel   ARGV[4] retention (ms)
-- per entry i, ARGV[j+1 .. j+8] with j = 4 + 8(i-1):
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
--   {'granted', token, done, cursor, attempt, stages, sources, startedAt, prevStatus}
-- The fencing counter is the record's 'token': a grant takes
-- max(token + 1, Redis TIME µs) (next_token), so no separate counter key.
-- Cost of a grant: HMGET of 12 fields (CLAIM_READ; a retry's due time
-- and a crashed holder's owner are read only then), GET lease, TIME, SET
-- lease, HSET, RPUSH, EXISTS watch (the entry stays in the taken set as
-- the read scored it: the holder's heartbeat moves it on);
-- plus one SMEMBERS of the paused set per call (an empty set while nothing is
-- paused: the only cost of pause on the hot path).
local owner, cap, channel = ARGV[1], ARGV[2], ARGV[3]
local queue = queue_at(KEYS, 3)
local now, now_us = clock()
local paused = nil -- scope -> true, only when some scope is paused
for _, scope in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  paused = paused or {}
  paused[scope] = true
end

-- scope_paused says whether the run of task is of a paused scope, and
-- returns its key's parts for parking.
local function scope_paused(task)
  if not paused then return false end
  local key = redis.call('HGET', task, 'key') or ''
  local bar = string.find(key, '|', 1, true)
  if not bar then return false end
  local scope = string.sub(key, bar + 1)
  return paused[scope] == true, scope, string.sub(key, 1, bar - 1)
end

-- ending is what finish_terminal needs when the claim ends a run (rare).
local function ending(task, hist, next_run_id, def_stages, def_max)
  return {task = task, q = queue, hist = hist, index = KEYS[1], cap = cap,
    retention = ARGV[4], next_run_id = next_run_id, stages = def_stages, max_attempts = def_max, now = now}
end

local function claim_one(task, lease_key, hist, lane, entry_id, run_id, source, ttl, next_run_id, def_stages, def_max)
  local rec = redis.call('HMGET', task, unpack(CLAIM_READ))
  local status = rec[2]
  if rec[1] ~= run_id or not (status == 'queued' or status == 'running' or status == 'retrying') then
    ack_entry(queue, entry_id)
    return {'ack'}
  end

  local holder = redis.call('GET', lease_key)
  if holder then
    local pttl = redis.call('PTTL', lease_key)
    -- Make the entry reclaimable the moment the lease would expire, not a
    -- whole idle period later; a live holder's heartbeat moves it on.
    redis.call('ZADD', queue.taken, 'XX', now + pttl, entry_id)
    return {'busy', holder, pttl}
  end

  -- A cancel (or replace) ends the run at once, even during its retry backoff.
  if rec[3] == '1' then
    finish_terminal(ending(task, hist, next_run_id, def_stages, def_max), 'cancelled', 'cancelled')
    publish_view(task, channel, KEYS[2])
    return {'ack'}
  end
  -- nextAttemptAt is set only while retrying (the claim clears it)
  local next_at = status == 'retrying' and redis.call('HGET', task, 'nextAttemptAt')
  if next_at and tonumber(next_at) and tonumber(next_at) > tonumber(now) then
    return {'busy', '', tonumber(next_at) - now}
  end

  -- A paused scope: nobody claims its runs. The entry is acknowledged (so
  -- no runner keeps reading or reclaiming it) and the run is parked with
  -- the source it was requested by; the record stays queued, running with
  -- an expired lease, or retrying, and is claimed as such after resume.
  local is_paused, scope, subject = scope_paused(task)
  if is_paused then
    ack_entry(queue, entry_id)
    redis.call('ZADD', KEYS[8], 0, scope .. ' ' .. subject)
    redis.call('HSET', task, 'entry', '', 'prun', run_id, 'psrc', source, 'plane', lane,
      'waiting', 'scope ' .. scope .. ' is paused', 'v', '')
    publish_view(task, channel, KEYS[2])
    return {'paused'}
  end

  -- Rolling deploys: a run whose remaining stages this runner does not
  -- define is left to a runner that does, never failed. The entry stays
  -- taken and is reclaimable at once (behind every entry due before it);
  -- the view says what it waits for.
  local missing = nil
  if def_stages == '' then
    missing = ''
  elseif def_stages ~= rec[8] then -- the same definition defines every stage
    local defined = {}
    for _, s in ipairs(split(def_stages, ',')) do defined[s] = true end
    local run_stages = split(rec[8], ',')
    for i = (tonumber(rec[9]) or 0) + 1, #run_stages do
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
    redis.call('ZADD', queue.taken, 'XX', now, entry_id)
    if rec[10] ~= why then
      redis.call('HSET', task, 'waiting', why, 'v', '')
      publish_view(task, channel, KEYS[2])
    end
    return {'foreign', missing}
  end

  local attempt, max_attempts = tonumber(rec[4]) or 0, tonumber(rec[5]) or 1
  if status == 'running' then
    -- The previous holder's lease expired without a finish: it crashed,
    -- paused or was cut off.
    hist_push(hist, cap, hist_ev(now, 'lease-lost', run_id, '', '', '', redis.call('HGET', task, 'owner'), rec[6]))
    if attempt >= max_attempts then
      finish_terminal(ending(task, hist, next_run_id, def_stages, def_max), 'failed', 'lease expired on the last attempt (' .. attempt .. ' of ' .. max_attempts .. ')')
      publish_view(task, channel, KEYS[2])
      return {'ack'}
    end
  end

  local token = next_token(rec[6], now_us)
  redis.call('SET', lease_key, lease_value(token, owner), 'PX', ttl)
  -- Hand the record to the new holder: the run keeps its completed stages
  -- and cursor, so a recovered run resumes.
  local done, cursor = tonumber(rec[9]) or 0, rec[11] or ''
  local stage = list_at(rec[8], done + 1)
  local attempt_now = attempt + 1
  local sources = list_add(rec[7], source)
  local started = rec[12]
  local fields = {'status', 'running', 'stage', stage, 'owner', owner, 'token', tok_str(token),
    'updatedAt', now, 'attempt', attempt_now, 'entry', entry_id, 'lane', lane}
  if sources ~= rec[7] then
    fields[#fields + 1] = 'sources'
    fields[#fields + 1] = sources
  end
  if not started or started == '' then
    started = now
    fields[#fields + 1] = 'startedAt'
    fields[#fields + 1] = now
  end
  if next_at and next_at ~= '' then
    fields[#fields + 1] = 'nextAttemptAt'
    fields[#fields + 1] = ''
  end
  if rec[10] and rec[10] ~= '' then
    fields[#fields + 1] = 'waiting'
    fields[#fields + 1] = ''
  end
  fields[#fields + 1] = 'v' -- the cached view (lib.lua submit_fast)
  fields[#fields + 1] = ''
  redis.call('HSET', task, unpack(fields))
  -- 'recovered' is reserved for crash recovery (the lease expired while
  -- running); a retry or a handed-back run is 'started' again, with its
  -- recovery mode as the outcome.
  local outcome = nil
  if attempt_now > 1 or done > 0 or cursor ~= '' then
    outcome = recovery_mode(done, cursor, #split(rec[8], ','))
  end
  hist_push(hist, cap, hist_ev(now, status == 'running' and 'recovered' or 'started', run_id, source, stage, outcome,
    owner, token))
  publish_view(task, channel, KEYS[2])
  return {'granted', token, done, cursor, attempt_now, rec[8], sources, started, status}
end

local out = {}
for i = 1, (#KEYS - 8) / 3 do
  local k, j = 6 + 3 * i, 4 + 8 * (i - 1)
  out[i] = claim_one(KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4],
    ARGV[j + 5], ARGV[j + 6], ARGV[j + 7], ARGV[j + 8])
end
return out
