-- lib/claiming.lua: deciding on an entry a runner took and granting its
-- lease (claim.lua, read_next.lua, and finish.lua for the next run of a
-- freed slot).

-- CLAIM_READ: the record fields claim.lua reads for each entry, in the
-- order of its rec[] indices (a retry's due time and a crashed holder's
-- owner are read only then).
local CLAIM_READ = {'runId', 'status', 'cancel', 'attempt', 'maxAttempts', 'token', 'sources', 'stages', 'done',
  'waiting', 'cursor', 'startedAt', 'v'}

-- recovery_mode mirrors checkpoints.Decide for the history event of a
-- recovered run: restart, resume or skip.
local function recovery_mode(done, cursor, n_stages)
  if done == 0 and (cursor == nil or cursor == false or cursor == '') then return 'restart' end
  if done >= n_stages then return 'skip' end
  return 'resume'
end

-- claim_ending is what finish_terminal needs when a claim ends a run (rare).
-- A follow-up's run id '' is derived from the ended run's (follow_up_id).
local function claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id)
  if next_run_id == '' then next_run_id = follow_up_id(run_id) end
  return {task = task, q = c.q, hist = hist, cap = c.cap, retention = c.retention,
    next_run_id = next_run_id, stages = def_stages, max_attempts = def_max, now = c.now}
end

-- claim_entry decides on one entry a runner took — stale, busy, foreign,
-- paused or granted — and on a grant takes the lease with the key's next
-- fencing token and enters the first incomplete stage (claim.lua has the
-- reply's contract). c: {owner, cap, events, watch, watched (publish),
-- q (queue_at), retention, parked (key), paused (paused_scopes), now,
-- now_us (clock)}; task, lease_key, hist: the entry's run's keys; then the entry,
-- the lease TTL (ms), a follow-up run id (used if the claim ends the run and
-- a follow-up is queued; '' derives one, see claim_ending), and this
-- runner's definition of the run's job.
local function claim_entry(c, task, lease_key, hist, lane, entry_id, run_id, source, ttl, next_run_id, def_stages, def_max)
  local now, owner = c.now, c.owner
  local rec = rcall('HMGET', task, unpk(CLAIM_READ))
  local status = rec[2]
  if rec[1] ~= run_id or not (status == 'queued' or status == 'running' or status == 'retrying') then
    ack_entry(c.q, entry_id)
    return {'ack'}
  end
  -- The lease is taken first, with the key's next fencing token: one SET NX
  -- where a GET and a SET were two. A branch below that grants nothing
  -- drops it again (in this script: nobody sees it).
  local token = next_token(rec[6], c.now_us)
  if not rcall('SET', lease_key, lease_value(token, owner), 'NX', 'PX', ttl) then
    local holder = rcall('GET', lease_key) or ''
    local pttl = rcall('PTTL', lease_key)
    -- Make the entry reclaimable the moment the lease would expire, not a
    -- whole idle period later; a live holder's heartbeat moves it on.
    rcall('ZADD', c.q.taken, 'XX', now + pttl, entry_id)
    mark_due('t', c.q, now + pttl, now)
    return {'busy', holder, pttl}
  end
  -- A cancel (or replace) ends the run at once, even during its retry backoff.
  if rec[3] == '1' then
    rcall('DEL', lease_key)
    finish_terminal(claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id), 'cancelled', 'cancelled')
    publish(c, task)
    return {'ack'}
  end
  -- nextAttemptAt is set only while retrying (the claim clears it)
  local next_at = status == 'retrying' and rcall('HGET', task, 'nextAttemptAt')
  if next_at and tonum(next_at) and tonum(next_at) > tonum(now) then
    rcall('DEL', lease_key)
    return {'busy', '', tonum(next_at) - now}
  end
  -- A paused scope: nobody claims its runs. The entry is acknowledged (so
  -- no runner keeps reading or reclaiming it) and the run is parked with
  -- the source it was requested by; the record stays queued, running with
  -- an expired lease, or retrying, and is claimed as such after resume.
  local is_paused, scope, subject = scope_paused(c.paused, task)
  if is_paused then
    rcall('DEL', lease_key)
    ack_entry(c.q, entry_id)
    rcall('ZADD', c.parked, 0, scope .. ' ' .. subject)
    rcall('HSET', task, 'entry', '', 'prun', run_id, 'psrc', source, 'plane', lane,
      'waiting', 'scope ' .. scope .. ' is paused', 'v', '')
    publish(c, task)
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
    for i = (small_num(rec[9]) or 0) + 1, #run_stages do
      if not defined[run_stages[i]] then missing = run_stages[i]; break end
    end
  end
  if missing then
    rcall('DEL', lease_key)
    local why
    if missing == '' then
      why = 'waiting for a runner that defines this job (' .. owner .. ' does not)'
    else
      why = 'waiting for a runner that defines stage ' .. missing .. ' (' .. owner .. ' does not)'
    end
    rcall('ZADD', c.q.taken, 'XX', now, entry_id)
    mark_due('t', c.q, now, now)
    if rec[10] ~= why then
      rcall('HSET', task, 'waiting', why, 'v', '')
      publish(c, task)
    end
    return {'foreign', missing}
  end
  local attempt, max_attempts = small_num(rec[4]) or 0, small_num(rec[5]) or 1
  if status == 'running' then
    -- The previous holder's lease expired without a finish: it crashed,
    -- paused or was cut off.
    hist_push(hist, c.cap, hist_ev(now, 'lease-lost', run_id, '', '', '', rcall('HGET', task, 'owner'), rec[6]))
    if attempt >= max_attempts then
      rcall('DEL', lease_key)
      finish_terminal(claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id), 'failed', 'lease expired on the last attempt (' .. attempt .. ' of ' .. max_attempts .. ')')
      publish(c, task)
      return {'ack'}
    end
  end
  -- Hand the record to the new holder: the run keeps its completed stages
  -- and cursor, so a recovered run resumes.
  local done, cursor = small_num(rec[9]) or 0, rec[11] or ''
  local stage = list_at(rec[8], done + 1)
  local attempt_now = attempt + 1
  local sources = list_add(rec[7], source)
  local started = rec[12]
  -- Only what changes is written (a field written costs more than one
  -- read). The record's lane matters only while the run is queued
  -- (promotion), so the claim leaves it; the entry is written unread
  -- (reading it to skip an equal write saved nothing).
  local fields = {'status', 'running', 'stage', stage, 'owner', owner, 'token', tok_str(token),
    'attempt', int_str(attempt_now), 'entry', entry_id}
  if sources ~= rec[7] then
    fields[#fields + 1] = 'sources'
    fields[#fields + 1] = sources
  end
  if not started or started == '' then
    started = now
    fields[#fields + 1] = 'startedAt' -- also the record's updatedAt (jobs.viewFromValues)
  else
    fields[#fields + 1] = 'updatedAt'
  end
  fields[#fields + 1] = now
  if next_at and next_at ~= '' then
    fields[#fields + 1] = 'nextAttemptAt'
    fields[#fields + 1] = ''
  end
  if rec[10] and rec[10] ~= '' then
    fields[#fields + 1] = 'waiting'
    fields[#fields + 1] = ''
    -- A run that waited (for a limiter, a runner that defines it) had its
    -- entry scored for a late recheck: due again when this lease would
    -- expire, so a holder that dies before its first heartbeat is
    -- taken over in time.
    rcall('ZADD', c.q.taken, 'XX', tonum(now) + tonum(ttl), entry_id)
    mark_due('t', c.q, tonum(now) + tonum(ttl), now)
  end
  if rec[13] and rec[13] ~= '' then
    fields[#fields + 1] = 'v' -- the cached view (lib/submitting.lua submit_fast)
    fields[#fields + 1] = ''
  end
  rcall('HSET', task, unpk(fields))
  -- 'recovered' is reserved for crash recovery (the lease expired while
  -- running); a retry or a handed-back run is 'started' again, with its
  -- recovery mode as the outcome.
  local outcome = nil
  if attempt_now > 1 or done > 0 or cursor ~= '' then
    outcome = recovery_mode(done, cursor, #split(rec[8], ','))
  end
  hist_push(hist, c.cap, hist_ev(now, status == 'running' and 'recovered' or 'started', run_id, source, stage, outcome,
    owner, token))
  publish(c, task)
  -- one string in a table (claim.lua's contract), the cursor last
  return {'granted' .. US .. token .. US .. int_str(done) .. US .. int_str(attempt_now) .. US .. (rec[8] or '') .. US ..
    sources .. US .. started .. US .. status .. US .. cursor}
end

-- claim_in_slot claims entry e (its parts from entry_parts) with
-- claim_entry, the run's record, lease and history keys derived under the
-- partition's hash tag: the caller took e in this same call, so it could
-- not pass them in KEYS; they are in the slot of the keys it did pass.
local function claim_in_slot(c, tag, e, run_id, key, source, ttl, next_run_id, stages, max_attempts)
  return claim_entry(c, tag .. ':task:' .. key, tag .. ':lease:' .. key, tag .. ':history:' .. key,
    ssub(e, 1, 1), e, run_id, source, ttl, next_run_id, stages, max_attempts)
end

-- claim_read claims the entries a read took off a partition's lanes
-- (taken, in order; tag and part its hash tag and part_of entry), each
-- with this runner's definition of its job from cf (conf_fields of
-- read_next.lua's ARGV[3]); returns the entries, each followed by its
-- claim reply. Shared by read_next.lua and read_idle.lua.
local function claim_read(cf, tag, part, taken, now, now_us)
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
    q = part.q, parked = part.parked, paused = paused, now = now, now_us = now_us}
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
end
