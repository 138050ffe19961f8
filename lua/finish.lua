-- finish: end an attempt, fenced. Releases the lease, acknowledges the
-- request entry and records the result in one script, so a key is never left
-- blocked by a lease, record or entry without the others.
-- KEYS[1] task record
-- KEYS[2], KEYS[3] (only when tracing is on) the key's follow-up trace
--          links (requests merged into its next run, see submit.lua) and
--          the links of the follow-up run ARGV[12]: a follow-up started here
--          takes the first as the second
-- The run's lease and history, and the partition's keys (retry queue,
-- watch key, queue keys, paused scopes, parked runs, events channel), are
-- derived from KEYS[1]'s name "<tag>:task:<key>" (lib/queues.lua tag_of): 1 key
-- declared instead of 12.
-- ARGV[1] what is constant for this runner and job, US-separated
--          (lib/base.lua conf_fields; jobs.finishConf): owner, reclaim
--          idle (ms: entries read here become reclaimable that long from
--          now), history cap, retention (ms), the job's stages here
--          (comma list) and maxAttempts (the definition a follow-up run
--          takes), the job's lease TTL (ms, for the claim of the entry taken),
--          'L' when the job has limiters: the entry taken is not claimed
--          here (its limiters admit it first, jobs.admitAndStart)
-- ARGV[2] token   ARGV[3] runId
-- ARGV[4] result: done | failed | cancelled | retry | defer | handback
--          (defer: the stage asked to run again later, jobs.RetryAfter —
--          a retry that does not count the attempt and never fails the run)
-- ARGV[5] stage completed by this call ("" if none)   ARGV[6] error text
-- ARGV[7] retry delay (ms), of a retry or a defer
-- A retry of a run whose cancel flag is set (a cancel or replace that landed
-- while this attempt was failing) ends it as cancelled at once instead of
-- waiting out the backoff.
-- ARGV[8] entries to take for the slot this attempt frees (0 or more), from
--          this partition's lanes, ARGV[9] first ('p' people first, 'b'
--          bulk first): see read_lanes
-- ARGV[10] the run's request entry: what the holder's claim wrote to the
--          record, passed instead of read
-- ARGV[11] the runner's token floor (jobs/tokenfloor.go; '' none): the
--          claim of the entry taken gets a token above it (lib/base.lua
--          floored)
-- ARGV[12] (only when tracing is on) the follow-up run id, which names
--          KEYS[3]; without it a follow-up's id is derived from the ended
--          run's (lib/claiming.lua claim_ending). Both serve only a
--          follow-up queued by a version without followUpRunId: the id its
--          first request fixed wins, and its links are named from KEYS[2]
--          (lib/runs.lua finish_terminal)
-- returns {1, status after}   {0, ''} not held   {-1, ''} ARGV[5] is not the
-- current stage — each followed by the entries taken. When the call takes
-- one entry and it is a run of the same job, the call also claims it for
-- this runner (lib/claiming.lua claim_entry, with this job's definition and lease
-- TTL): the entry is followed by its claim reply (see claim.lua), and the
-- slot's next run costs no claim call. Its record, lease and history keys
-- are derived from the entry's task key and this key's partition tag: the
-- exception to "every key in KEYS" with the partition's keys, in the slot
-- of the declared keys.
-- Cost of a done run: HMGET of 10 fields (a retry or hand-back reads 3
-- more, a follow-up's start 4 more), TIME, DEL lease (which also tells
-- whether it is held), ZREM taken, HSET,
-- RPUSH (the stage and the result events together), PEXPIRE x2, EXISTS
-- watch (of watch and paused keys together when it takes an entry); the read
-- adds LMPOP of both lanes (Redis 7; elsewhere LPOP per lane until it
-- has its entries), ZADD taken, and LLEN of the
-- bell when it took all it asked for — instead of a separate read's round
-- trip.
local task = KEYS[1]
local tag = tag_of(task)
local key = ssub(task, #tag + 7) -- KEYS[1] is <tag>:task:<key>
local lease_key, hist = tag .. ':lease:' .. key, tag .. ':history:' .. key
local part = part_of(tag)
local queue, events, watch, paused_key = part.q, part.events, part.watch, part.paused
-- A finish that takes an entry may claim it: then it needs the paused
-- scopes too, asked with the watch key in one EXISTS (watch_and_paused).
local cf = conf_fields(ARGV[1])
local owner, idle, cap, retention, def_stages, def_max, ttl = cf[1], cf[2], cf[3], cf[4], cf[5], cf[6], cf[7]
local n = small_num(ARGV[8]) or 0
local watched, paused = nil, nil
if n > 0 then watched, paused = watch_and_paused(watch, paused_key) end
local pw = {events = events, watch = watch, watched = watched} -- publish's state, shared with the claim of the entry taken

-- The attempt's end, then (n > 0) the read. Written as one block left with
-- break rather than as local functions: a closure is made on every call,
-- and these two, capturing about fifteen upvalues each, cost ~4,000
-- instructions apiece.
local out, now, now_us
repeat
  local token, run_id, result = ARGV[2], ARGV[3], ARGV[4]
  -- the record fields every finish reads (the fence, the completed stage's
  -- check and what finish_terminal clears); the holder's claim wrote the
  -- rest of what finish_terminal needs (entry, owner, key), or
  -- cleared it (nextAttemptAt, waiting). One table constructor: built
  -- field by field it would be resized four times.
  -- The cursor and the cached view are read so that what is empty is not
  -- written again (a field read costs less than one written).
  local v = rcall('HMGET', task, 'runId', 'token', 'stage', 'stages', 'done', 'followUp', 'cancel', 'lastError',
    'cursor', 'v')
  -- Held: the record has this grant's token and the lease key still
  -- exists. Every grant sets the lease key and the record's token in one
  -- script, so while the record has this token the lease key, if it
  -- exists, is this grant's: the DEL below tells whether it exists
  -- (instead of a GET of its value first).
  if v[1] ~= run_id or v[2] ~= token then out = {0, ''}; break end
  local r = {runId = v[1], token = v[2], stage = v[3] or nil, stages = v[4] or nil, done = v[5] or nil,
    followUp = v[6] or nil, cancel = v[7] or nil, lastError = v[8] or nil, v = v[10] or nil,
    key = key, entry = ARGV[10], owner = owner, partial = true}
  now, now_us = clock()
  local before = nil -- the completed stage's event, appended with the result's
  local upd = nil    -- the completed stage's checkpoint fields, written with the result's
  if ARGV[5] ~= '' then
    local done = small_num(r.done) or 0
    if list_at(r.stages, done + 1) ~= ARGV[5] then
      if rcall('GET', lease_key) ~= lease_value(token, owner) then out = {0, ''} else out = {-1, ''} end
      break
    end
    upd = {'done', int_str(done + 1)}
    if v[9] and v[9] ~= '' then upd[3], upd[4] = 'cursor', '' end
    if result == 'handback' then
      r.stage = list_at(r.stages, done + 2)
      upd[#upd + 1] = 'stage'
      upd[#upd + 1] = r.stage
    end
    before = hist_ev(now, 'stage', run_id, '', ARGV[5], 'done', owner, token)
  end
  if rcall('DEL', lease_key) == 0 then out = {0, ''}; break end -- expired: not held
  local attempt, max_attempts = 1, 1
  local retrying = result == 'retry' or result == 'defer'
  if retrying or result == 'handback' then
    ft_read(task, {'attempt', 'maxAttempts', 'sources'}, r)
    attempt, max_attempts = small_num(r.attempt) or 1, small_num(r.maxAttempts) or 1
  end
  if retrying and r.cancel == '1' then
    result, retrying, ARGV[6] = 'cancelled', false, 'cancelled'
  elseif result == 'retry' and attempt >= max_attempts then
    result, retrying = 'failed', false
  end

  if retrying then
    local due = now + tonum(ARGV[7])
    ack_entry(queue, r.entry)
    local fields = {'status', 'retrying', 'nextAttemptAt', due, 'lastError', ARGV[6],
      'entry', '', 'updatedAt', now, 'v', ''}
    local what = 'attempt ' .. attempt .. ' of ' .. max_attempts
    if result == 'defer' then -- the attempt is given back: the claim counts it again
      fields[#fields + 1], fields[#fields + 2] = 'attempt', int_str(attempt - 1)
      what = 'deferred: attempt ' .. attempt .. ' not counted'
    end
    rcall('HSET', task, unpk(with_fields(fields, upd)))
    rcall('ZADD', part.retry, due, run_id .. ' ' .. r.key)
    mark_due('r', part.q, due, now)
    hist_push_after(hist, cap, before, hist_err(now, 'retry-scheduled', run_id, r.stage, what, owner, token, ARGV[6]))
  elseif result == 'handback' then
    -- Graceful shutdown: keep the checkpoint, give the attempt back and
    -- re-queue at once so another runner resumes without waiting for the TTL.
    ack_entry(queue, r.entry)
    local srcs = r.sources
    local lane = lane_for(srcs)
    local first = list_at(srcs, 1)
    if first == '' then first = 'manual' end
    local id = enqueue(queue, lane, run_id, r.key, first)
    rcall('HSET', task, unpk(with_fields({'status', 'queued', 'attempt', int_str(attempt - 1), 'entry', id, 'lane', lane,
      'updatedAt', now, 'v', ''}, upd)))
    hist_push_after(hist, cap, before, hist_ev(now, 'handed-back', run_id, '', r.stage, '', owner, token))
  else
    local next_run_id = ARGV[12] -- nil (untraced): derived if a follow-up starts
    if next_run_id == '' then next_run_id = nil end
    finish_terminal({task = task, q = queue, hist = hist, cap = cap,
      retention = retention, next_run_id = next_run_id, stages = def_stages,
      max_attempts = def_max, now = now, extra = upd, links_from = KEYS[2], links_to = KEYS[3]}, result, ARGV[6], r,
      before)
  end
  publish(pw, task)
  if retrying then
    out = {1, 'retrying'}
  elseif result == 'handback' or r.followUp == '1' then
    out = {1, 'queued'}
  else
    out = {1, result}
  end
until true

if n > 0 then
  if not now then now, now_us = clock() end
  now_us = floored(now_us, ARGV[11])
  read_lanes(out, queue, ARGV[9] == 'b' and 'b' or 'p', n, now + conf_num(idle), now)
  -- The one entry taken is claimed here when it is a run of this job
  -- (entry_parts: nil for an entry that is not tasklease's, which the
  -- caller drops; another job's the caller claims with its definition).
  if n == 1 and #out == 3 then
    local e = out[3]
    local run_id, next_key, scope, source = entry_parts(e)
    if run_id and scope == ssub(key, sfind(key, '|', 1, true) + 1) and cf[8] ~= 'L' then
      local c = {owner = owner, cap = cap, events = events, watch = watch, watched = pw.watched,
        retention = retention, q = queue, parked = part.parked, paused = paused, now = now, now_us = now_us}
      out[4] = claim_in_slot(c, tag, e, run_id, next_key, source, ttl, '', def_stages, def_max)
    end
  end
end
return out
