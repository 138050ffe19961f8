-- lib/runs.lua: starting a run (a record with its request) and ending one
-- (done, failed or cancelled, starting its queued follow-up).

-- new_run creates a queued run on record task and appends its request to
-- the partition's list of its lane, in the same script: a run record never
-- exists without its request, nor a request without its record (no
-- orphans). A record that exists keeps 'token', the key's fencing counter,
-- and folds its coalesced requests (co, its 'co' field) into the history
-- first; a new record writes only the fields that are not empty or
-- implied. q: the partition's queue keys; key: the task key; sources: the
-- run's sources (comma list), source: the first; last_success: the ending
-- run's finishedAt when it was done, else nil; not_before (ms, or nil): a
-- delayed run, whose entry goes straight into the taken set, due then —
-- the reclaim pass claims it when it is due, as it does an entry whose
-- holder died — and whose 'waiting' says so ("notBefore <ms>", which
-- jobs.viewFromValues shows as the view's notBefore). Positional, not a
-- table: a table per new run cost ~2,500 instructions. prior: the record's
-- 'prior' to write when it exists (prior_after), or nil.
local function new_run(task, q, hist, key, run_id, stages, max_attempts, sources, source, now, exists, co, last_success,
                       not_before, prior)
  local lane = lane_for(sources)
  local id, waiting
  if not_before then
    id, waiting = lane .. run_id .. US .. key .. US .. source, 'notBefore ' .. not_before
    rcall('ZADD', q.taken, not_before, id)
    mark_due('t', q, not_before, now)
  else
    id = enqueue(q, lane, run_id, key, source)
  end
  if exists then
    co_fold(task, hist, co)
    local f = {'runId', run_id, 'status', 'queued', 'stages', stages, 'done', '0',
      'stage', '', 'cursor', '', 'attempt', '0', 'maxAttempts', max_attempts, 'sources', sources,
      'owner', '', 'requestedAt', now, 'startedAt', '', 'updatedAt', now, 'finishedAt', '',
      'nextAttemptAt', '', 'lastError', '', 'cancel', '0', 'followUp', '0', 'followUpSources', '',
      'entry', id, 'lane', lane, 'waiting', waiting or '', 'v', ''}
    -- finishedAt is cleared, so a done run's time (last_success) moves to
    -- lastSuccessAt: finish_terminal writes it to finishedAt alone
    if last_success then f[#f + 1], f[#f + 2] = 'lastSuccessAt', last_success end
    if prior then f[#f + 1], f[#f + 2] = 'prior', prior end
    rcall('HSET', task, unpk(f))
    rcall('PERSIST', task)
    rcall('PERSIST', hist)
  else
    -- absent fields read as empty: done and attempt as 0, lane as bulk;
    -- subject and scope are the key's parts
    if waiting then
      rcall('HSET', task, 'key', key, 'runId', run_id, 'status', 'queued', 'stages', stages,
        'maxAttempts', max_attempts, 'sources', sources, 'requestedAt', now, 'entry', id, 'lane', lane,
        'waiting', waiting)
    elseif lane == 'p' then
      rcall('HSET', task, 'key', key, 'runId', run_id, 'status', 'queued', 'stages', stages,
        'maxAttempts', max_attempts, 'sources', sources, 'requestedAt', now, 'entry', id, 'lane', lane)
    else
      rcall('HSET', task, 'key', key, 'runId', run_id, 'status', 'queued', 'stages', stages,
        'maxAttempts', max_attempts, 'sources', sources, 'requestedAt', now, 'entry', id)
    end
  end
  return id
end

-- prior_after is a record's 'prior' once a new run replaces run cur: the
-- ids of the last two runs before the one on record, newest first, space
-- separated. A request repeated after its run ended and another began
-- (go-redis sends a call again when its reply was lost, and the repeat may
-- land seconds later) is known by them (submit_one) instead of starting
-- the ended run's id again. Cost: ~50 bytes per key.
local function prior_after(cur, prior)
  if not cur or cur == '' then return prior end
  if not prior or prior == '' then return cur end
  local sp = sfind(prior, ' ', 1, true)
  return cur .. ' ' .. (sp and ssub(prior, 1, sp - 1) or prior)
end

-- was_prior reports whether run_id is one of prior's (prior_after).
local function was_prior(prior, run_id)
  if not prior or prior == '' then return false end
  local sp = sfind(prior, ' ', 1, true)
  if not sp then return prior == run_id end
  return ssub(prior, 1, sp - 1) == run_id or ssub(prior, sp + 1) == run_id
end

-- follow_up_id is the run id of the follow-up of run run_id when the caller
-- sent none: a run ends once, so it is as unique as a random one, and
-- callers need not send an id for this rare case.
local function follow_up_id(run_id)
  return ssub(redis.sha1hex('follow-up of ' .. run_id), 1, 24)
end

-- FT_FIELDS are the record fields finish_terminal reads when its caller
-- passes no record (ft_read).
local FT_FIELDS = {'entry', 'runId', 'key', 'followUp', 'followUpSources', 'stages', 'maxAttempts',
  'stage', 'owner', 'token', 'lane', 'co', 'cancel', 'nextAttemptAt', 'waiting', 'lastError', 'v', 'followUpRunId', 'prior'}

-- ft_read reads fields (a list of names) of task into table r, by name:
-- r[name] is the value, or nil when the field is absent.
local function ft_read(task, fields, r)
  r = r or {}
  local vals = rcall('HMGET', task, unpk(fields))
  for i = 1, #fields do
    if vals[i] then r[fields[i]] = vals[i] end
  end
  return r
end

-- FT_FOLLOW_UP: the fields only the start of a queued follow-up reads.
local FT_FOLLOW_UP = {'followUpSources', 'co', 'maxAttempts', 'followUpRunId', 'prior'}

-- finish_terminal ends the current run as done, failed or cancelled: it
-- acknowledges its request, records the result, and starts the queued
-- follow-up if there is one; otherwise record and history expire after the
-- retention. A follow-up is a new run: it takes the job's current
-- definition (c.stages, c.max_attempts, from the caller's registry), not the
-- ended run's; c.stages '' (a caller that does not define the job) keeps the
-- ended run's. The caller has already released (or never held) the lease.
-- r: the record by field name, holding FT_FIELDS, or nil to read them; with
-- r.partial those of FT_FOLLOW_UP are left out (read here when a follow-up
-- starts).
-- A field the caller knows to be empty may be left out (a holder's finish:
-- nextAttemptAt and waiting are cleared by the claim).
-- before: an encoded event appended just before the result's (or nil).
-- The task index is not re-scored: it is scored by a key's last request
-- (submit_one), which is what the console pre-selects by; the janitor
-- re-scores a candidate whose record still exists, so an entry leaves at
-- most two retentions after its request.
-- The follow-up's id is the one its first request fixed (followUpRunId,
-- lib/submitting.lua follow_up_run): the requests it serves are logged
-- under it and their requesters follow it. Its requests are in the
-- history already; starting it appends none.
-- c: {task, q, hist, cap, retention, next_run_id (the follow-up's id when
--     the record has none fixed: '' starts none, nil derives one with
--     follow_up_id),
--     stages, max_attempts, now, extra (more record fields to write, or nil),
--     links_from and links_to (or nil): the trace links of the requests
--     queued behind the run become the follow-up's (a new run: nothing
--     else can have written its links yet); links_to names the links of
--     next_run_id, and those of a fixed id are named from links_from
--     (keyspace Links and FollowUpLinks: "...|next" and "...|<runId>")}
local function finish_terminal(c, result, err, r, before)
  r = r or ft_read(c.task, FT_FIELDS)
  ack_entry(c.q, r.entry)
  err = err or ''
  -- finishedAt is also the record's updatedAt (jobs.viewFromValues) and,
  -- for a done run, its last success (submit_one): one field, not three.
  -- The entry is left as it is: nothing reads a finished run's entry.
  local fields = {'status', result, 'finishedAt', c.now}
  local n = 4
  -- fields the run set that a finished record shows empty
  local v = r.stage
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'stage', '', n + 2 end
  v = r.cancel
  if v and v ~= '0' then fields[n + 1], fields[n + 2], n = 'cancel', '0', n + 2 end
  v = r.nextAttemptAt
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'nextAttemptAt', '', n + 2 end
  v = r.waiting
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'waiting', '', n + 2 end
  if err ~= '' or (r.lastError and r.lastError ~= '') then
    fields[n + 1], fields[n + 2], n = 'lastError', err, n + 2
  end
  if c.extra then
    for i = 1, #c.extra do fields[n + i] = c.extra[i] end
    n = n + #c.extra
  end
  if r.v and r.v ~= '' then fields[n + 1], fields[n + 2] = 'v', '' end -- the cached view (submit_fast)
  rcall('HSET', c.task, unpk(fields))
  hist_push_after(c.hist, c.cap, before, hist_err(c.now, result, r.runId, r.stage, '', r.owner, r.token, err))
  if r.followUp == '1' and c.next_run_id ~= '' then
    if r.partial then ft_read(c.task, FT_FOLLOW_UP, r) end
    local next_run_id, links_to = r.followUpRunId, c.links_to
    if next_run_id and next_run_id ~= '' then
      if c.links_from then links_to = ssub(c.links_from, 1, #c.links_from - 4) .. next_run_id end
    else
      next_run_id = c.next_run_id or follow_up_id(r.runId) -- queued by a version before followUpRunId
    end
    -- A run id names one run: never the follow-up of itself (a repeated
    -- request that queued it once it had started; submit_one answers those).
    if next_run_id == r.runId then next_run_id = follow_up_id(r.runId) end
    local srcs = r.followUpSources
    local first = list_at(srcs, 1)
    if first == '' then first = 'manual' end
    local stages, max_attempts = r.stages, r.maxAttempts
    if c.stages and c.stages ~= '' then stages, max_attempts = c.stages, c.max_attempts end
    new_run(c.task, c.q, c.hist, r.key, next_run_id, stages, max_attempts, srcs, first, c.now, true, r.co,
      result == 'done' and c.now or nil, nil, prior_after(r.runId, r.prior))
    if c.links_from and rcall('EXISTS', c.links_from) == 1 then rcall('RENAME', c.links_from, links_to) end
  elseif conf_num(c.retention) > 0 then
    rcall('PEXPIRE', c.task, c.retention)
    rcall('PEXPIRE', c.hist, c.retention)
  end
end
