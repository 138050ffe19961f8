-- lib/submitting.lua: routing a TaskStartRequest by the key's state and
-- the conflict policy (submit.lua, submit_many.lua), with the cached view
-- that lets a repeat change nothing but a counter.

-- POLICY_OUTCOME: the outcome of a request on an active run, by policy,
-- for the policies whose repeats are coalesced.
local POLICY_OUTCOME = {join = 'joined', skip = 'skipped', queue = 'queued'}

-- VIEW_FIELDS are the record fields a TaskView shows, in the order of
-- jobs.viewFields (submit.lua replies with them instead of the whole
-- record).
local VIEW_FIELDS = {'runId', 'status', 'stage', 'stages', 'done', 'attempt', 'maxAttempts', 'sources',
  'owner', 'token', 'requestedAt', 'startedAt', 'updatedAt', 'finishedAt', 'nextAttemptAt', 'lastError',
  'cancel', 'followUp', 'waiting'}

-- SUBMIT_READ: the record fields submit_one reads in its one HMGET: the
-- view it replies with (VIEW_FIELDS, first, so a reply can be cut from the
-- HMGET), then what it decides on.
local SUBMIT_READ = {'runId', 'status', 'stage', 'stages', 'done', 'attempt', 'maxAttempts', 'sources',
  'owner', 'token', 'requestedAt', 'startedAt', 'updatedAt', 'finishedAt', 'nextAttemptAt', 'lastError',
  'cancel', 'followUp', 'waiting', 'lastSuccessAt', 'followUpSources', 'lane', 'entry', 'co', 'group', 'prior'}

-- view_reply encodes the view fields as one string, US-separated in
-- VIEW_FIELDS order (jobs.viewFromReply): one reply value instead of a
-- list. r is a record table by field name, or nil with vals, an HMGET
-- holding VIEW_FIELDS' values from index off + 1.
local function view_reply(r, vals, off)
  local out = {}
  for i = 1, #VIEW_FIELDS do
    if r then out[i] = r[VIEW_FIELDS[i]] or '' else out[i] = vals[off + i] or '' end
  end
  return table.concat(out, US)
end

-- submit_read reads what submit_one decides on (one HMGET): the coalescing
-- counters of this request's outcomes and its occurrence field (indices
-- 1..5), then SUBMIT_READ (from index 6).
local function submit_read(task, src, policy, occ_field)
  -- a new key (the common case of a fan-out or a first request): nothing to read
  if rcall('EXISTS', task) == 0 then return {} end
  local po = POLICY_OUTCOME[policy] or 'replaced'
  return rcall('HMGET', task, co_field(src, po), n_field(src, po), co_field(src, 'throttled'),
    n_field(src, 'throttled'), occ_field ~= '' and occ_field or 'runId', unpk(SUBMIT_READ))
end

-- The record caches its encoded view (view_reply) in field 'v', so that a
-- request that changes nothing reads a few fields instead of every view
-- field (on a record of ~20 fields an HMGET of all of them costs more than
-- the rest of the request). Every script that writes a view field also
-- clears 'v' in the same HSET when it holds a view (a script that read
-- it; the others write 'v' = '' unread). The cache is used only while its stamp
-- (V_TAG, runId, status, updatedAt) still matches the record — every write
-- of a view field, in this version and before it, changes the status or
-- sets updatedAt (a claim's first attempt and a finish write startedAt and
-- finishedAt instead, and change the status) —, so a writer that does not
-- clear it (an older version during a rolling deploy) cannot make it answer
-- with a stale run, status or stage.
local V_TAG = 'v2' -- bump when VIEW_FIELDS or the stamp change (jobs.TestViewCacheTag pins it)

-- LINKS_MAX bounds a run's trace links (jobs.linksMax).
local LINKS_MAX = 32

-- FAST_READ: after the co and n fields of the request's outcome.
local FAST_READ = {'status', 'runId', 'updatedAt', 'v'}

-- view_stamp is the prefix of a valid cached view for fast-read values f,
-- ending in RS (0x1E, which no stamp field holds): a view reply is always
-- "<stamp>RS<view>", the stamp empty when the view was not cached
-- (jobs.viewFromReply cuts at the first RS).
local function view_stamp(f)
  return V_TAG .. (f[4] or '') .. US .. f[3] .. US .. (f[5] or '') .. '\30'
end

-- FAST holds, by (source, policy), what submit_fast needs of a request:
-- {co field, n field, outcome}, or false for a policy it does not answer
-- (queue, replace). Filled on first use (fast_of) and kept by the
-- Functions library across calls: a repeat then makes no field names.
local FAST = {}

-- fast_of is FAST's entry for src and policy, stored under k (any value
-- naming the pair).
local function fast_of(src, policy, k)
  local f = FAST[k]
  if f == nil then
    local po = POLICY_OUTCOME[policy]
    f = false
    if po == 'joined' or po == 'skipped' then f = {co_field(src, po), n_field(src, po), po} end
    FAST[k] = f
  end
  return f
end

-- request_timing reads a request's timing field (jobs.appendTiming):
-- "<minInterval ms>", followed for a delayed request by "+<delay ms>" —
-- and "~<debounceMax ms>" for a debounced one — and/or "@<not before, unix
-- ms>", and last, for a request that names a fair-share group,
-- "|<group>" (jobs.requestArg; a group holds no '|'). Returns the min
-- interval, the not-before time (ms, a number; nil when not delayed or
-- already due at now), the debounce bound (or nil) and the group ('' for
-- none).
-- (One statement per variable: gopher-lua, miniredis's Lua, assigns a
-- multiple assignment's first target before it evaluates the others.)
local function request_timing(field, now)
  local nb, dmax = nil, nil
  local group = ''
  local bar = sfind(field, '|', 1, true)
  if bar then
    group = ssub(field, bar + 1)
    field = ssub(field, 1, bar - 1)
  end
  local at = sfind(field, '@', 1, true)
  if at then
    nb = tonum(ssub(field, at + 1))
    field = ssub(field, 1, at - 1)
  end
  local plus = sfind(field, '+', 1, true)
  if plus then
    local d = ssub(field, plus + 1)
    local tl = sfind(d, '~', 1, true)
    if tl then
      dmax = tonum(ssub(d, tl + 1))
      d = ssub(d, 1, tl - 1)
    end
    local rel = tonum(now) + (tonum(d) or 0)
    if not nb or rel > nb then nb = rel end
    field = ssub(field, 1, plus - 1)
  end
  if nb and nb <= tonum(now) then nb = nil end
  return small_num(field), nb, dmax, group
end

-- POLICY_OF and SOURCE_OF name a request's policy and source by the
-- letter (its first, as a byte) it travels as in submit.lua's request
-- argument (jobs.requestArg).
local POLICY_OF = {[106] = 'join', [115] = 'skip', [113] = 'queue', [114] = 'replace'}
local SOURCE_OF = {[109] = 'manual', [102] = 'foreground', [115] = 'schedule', [114] = 'retry'}

-- submit_fast answers a request that changes nothing but a counter — a
-- repeated join or skip on an active run — with one HMGET of 6 fields and
-- one HSET; the view comes from the cache ('v'), or, on the first such
-- request after a change, from an HMGET of VIEW_FIELDS that refills it.
-- A repeat is a request whose source and outcome already have their co
-- field in this run: the first of them went through submit_one, which
-- wrote that field in the same HSET as everything a join changes (the
-- source added to sources, a promotion to the people lane), and a run's
-- sources only grow, so a repeat changes nothing. ff is fast_of's entry
-- for the request; want_view false (callers that reply with outcomes only)
-- skips the view.
-- Returns outcome and view (with its stamp), or nil — and false when
-- there is no record — when submit_one must decide.
local function submit_fast(task, ff, now, want_view)
  if not ff then return nil end
  local nf, po = ff[2], ff[3]
  local f = rcall('HMGET', task, ff[1], nf, unpk(FAST_READ))
  local status = f[3]
  if not status then return nil, false end
  if not (status == 'queued' or status == 'running' or status == 'retrying') then return nil, true end
  if not co_of_run(f[1], f[4]) then return nil, true end
  local count = repeat_count(f[2], now)
  if not want_view then
    rcall('HSET', task, nf, count)
    return po, ''
  end
  local stamp, v = view_stamp(f), f[6]
  if v and sfind(v, stamp, 1, true) == 1 then
    rcall('HSET', task, nf, count)
    return po, v
  end
  v = stamp .. view_reply(nil, rcall('HMGET', task, unpk(VIEW_FIELDS)), 0)
  rcall('HSET', task, nf, count, 'v', v)
  return po, v
end

-- follow_up_link keeps the trace context of a request merged into the
-- key's next run (queued, or replacing the active run) in the key's
-- follow-up links (submit.lua, when traced), which the script that starts
-- that run renames to its links (finish_terminal). The first such request
-- of a run (no follow-up queued yet, follow_up not '1') drops what a
-- follow-up that never started (cancelled) left there.
local function follow_up_link(a, follow_up)
  if not a.links_next then return end
  if follow_up ~= '1' then rcall('DEL', a.links_next) end
  if a.tp == '' then return end
  rcall('RPUSH', a.links_next, a.tp)
  rcall('LTRIM', a.links_next, 0, LINKS_MAX - 1)
  if conf_num(a.retention) > 0 then rcall('PEXPIRE', a.links_next, a.retention) end
end

-- follow_up_run is the run id of the key's follow-up, which serves a queue
-- or replace request: fixed by the request that queues it (its new run id,
-- a.run_id) and kept in field followUpRunId, so that every request it
-- serves is logged under it and its requester can follow it (the reply
-- names it) — the finish that starts it takes this id (finish_terminal).
-- A follow-up queued before the field existed (followUp '1' without it)
-- is given one now. put writes a field in the caller's HSET.
local function follow_up_run(r, a, put)
  -- read here, not with SUBMIT_READ: joins, the common requests, do not pay for it
  local id = r.followUp == '1' and rcall('HGET', a.task, 'followUpRunId')
  if not id or id == '' then
    id = a.run_id
    put('followUpRunId', id)
  end
  return id
end

-- seen_subject adds a.key's subject to its scope's subjects ("subjects:
-- all"): a.subjects and a.subject when the caller declared them
-- (submit_many), else named from the partition tag a.tag (keyspace
-- Subjects) and split from a.key.
local function seen_subject(a, now)
  if a.subjects then
    rcall('ZADD', a.subjects, now, a.subject)
    return
  end
  local bar = sfind(a.key, '|', 1, true)
  rcall('ZADD', a.tag .. ':subjects-seen:' .. ssub(a.key, bar + 1), now, ssub(a.key, 1, bar - 1))
end

-- submit_one routes one TaskStartRequest (see submit.lua for the rules);
-- vals is submit_read's reply when the caller has it ({} for a key with
-- no record).
-- Dedup is by task key only; the source is recorded, never compared.
-- returns the outcome: started | joined | queued | skipped | replaced |
-- throttled, or duplicate when occ_field already holds occ or a later
-- occurrence (unix seconds) — this occurrence already reached the key, or a
-- newer one did; nothing is written. Then the view (see submit.lua), and
-- for queued and replaced the id of the follow-up that serves the request
-- (follow_up_run).
local function submit_one(a, vals)
  local task, hist, now, src = a.task, a.hist, a.now, a.source
  vals = vals or submit_read(task, src, a.policy, a.occ ~= '' and a.occ_field or '')
  local X = 5 -- SUBMIT_READ starts at vals[X + 1]
  -- A repeat of this occurrence, or a late batch of an older one (a leader
  -- paused past its term), writes nothing: occurrences only move forward.
  if a.occ ~= '' and (tonum(vals[5]) or -1) >= tonum(a.occ) then
    return 'duplicate'
  end
  local cur, status = vals[X + 1], vals[X + 2]
  -- The run on record has this request's own run id (a new one for each
  -- request): this is a repeat of the request that started or queued it —
  -- go-redis sends a call again when its reply was lost, and Redis runs
  -- the script twice. It is served already; writing again would queue the
  -- run behind itself, cancel it (replace) or start it anew. The caller
  -- reads the view.
  -- So is one whose run ended since and a run after it is on record
  -- (prior: the runs before the one on record): a request's own id names
  -- one run only.
  if cur == a.run_id or was_prior(vals[X + 26], a.run_id) then return 'joined' end
  local active = status == 'queued' or status == 'running' or status == 'retrying'
  -- A new run (no active one, not throttled): nothing read is needed but
  -- whether the record exists, and the reply is what was written.
  -- the last success: a done run's finishedAt, or what new_run kept of an
  -- earlier one
  local last_success = status == 'done' and vals[X + 14] or nil
  local last = last_success or vals[X + 20]
  last = last and tonum(last)
  local throttled = not active and a.min_interval > 0 and last and (src == 'schedule' or src == 'foreground')
    and now - last < a.min_interval
  if not active and not throttled then
    new_run(task, a.q, hist, a.key, a.run_id, a.stages, a.max_attempts, src, src, now, status and true or false,
      vals[X + 24], last_success, a.not_before, prior_after(cur, vals[X + 26]))
    -- The run's fair-share group (jobs.SubmitOptions.Group), which the
    -- limiter scripts read: written only when the request names one, and
    -- one that a run before it left on the record is dropped. A request
    -- without a group on a record without one costs nothing more.
    if a.group ~= '' then
      rcall('HSET', task, 'group', a.group)
    elseif vals[X + 25] then
      rcall('HDEL', task, 'group')
    end
    hist_push(hist, a.cap, hist_ev(now, 'requested', a.run_id, src, '', 'started'))
    rcall('ZADD', a.index, now, a.key)
    if src ~= 'schedule' then seen_subject(a, now) end
    if a.occ ~= '' then rcall('HSET', task, a.occ_field, a.occ) end
    publish(a.part, task)
    -- the caller knows the rest of the new run's view (jobs.startedView)
    return 'started', now
  end
  local r = {}
  for i = 1, #SUBMIT_READ do r[SUBMIT_READ[i]] = vals[X + i] end
  local set = {} -- fields of the record written by one HSET at the end
  local function put(f, v)
    set[#set + 1] = f
    set[#set + 1] = v
    if r then r[f] = v end
  end
  -- run: the run the request is logged under, the one that serves it.
  -- nofast: the request is not to be answered by submit_fast when
  -- repeated (a delayed run: a repeat without a delay must start it), so
  -- its co value is written so that co_of_run does not match it.
  local function coalesce(event, outcome, c, n, run, nofast)
    local f, v, new = hist_request(hist, a.cap, now, event, run, src, outcome, c, n)
    if nofast and new then v = '~' .. v end
    put(f, v)
    if new then put('co', list_add(r.co, f)) end
  end
  -- "subjects: all" means every subject people or apps asked for within
  -- the retention (schedule requests do not keep a subject in the set). It
  -- is written when a run starts and when a source first joins a run, not
  -- for every repeat.
  local function seen()
    if src ~= 'schedule' then seen_subject(a, now) end
  end
  local outcome, served -- served: the follow-up's id for queued and replaced
  local changed = false -- whether the view changed (published only then)
  if not active then
    coalesce('throttled', 'throttled', vals[3], vals[4], cur or '')
    outcome = 'throttled'
  elseif a.policy == 'join' then
    local srcs = list_add(r.sources, src)
    if srcs ~= r.sources then
      put('sources', srcs)
      seen()
      changed = true
    end
    -- A delayed run (lib/runs.lua new_run) joined by a request without a
    -- delay starts now: its entry goes to its lane (the one in the taken
    -- set finds the run started or over when it comes due).
    local delayed = status == 'queued' and r.waiting and ssub(r.waiting, 1, 10) == 'notBefore '
    if delayed and not a.not_before then
      local lane = lane_for(srcs)
      put('entry', enqueue(a.q, lane, cur, a.key, src))
      put('lane', lane)
      put('waiting', '')
      delayed, changed = false, true
    elseif delayed and a.debounce_max then
      -- a debounced request moves the start to its own not-before, never
      -- past the run's first request + debounceMax
      local nb, cap = a.not_before, (tonum(r.requestedAt) or tonum(now)) + a.debounce_max
      if cap < nb then nb = cap end
      if nb > (tonum(ssub(r.waiting, 11)) or 0) and r.entry and r.entry ~= '' then
        rcall('ZADD', a.q.taken, 'XX', nb, r.entry)
        put('waiting', 'notBefore ' .. nb)
        changed = true
      end
    end
    coalesce('joined', 'joined', vals[1], vals[2], cur, delayed)
    -- A person joining a queued bulk run promotes it to the people lane; a
    -- run parked by a paused scope (no entry) is re-queued there on resume.
    -- A delayed run is not in a lane: it keeps waiting (a delayed request
    -- joined it; one without a delay started it above).
    -- The bulk entry stays where it is (removing it from the middle of a
    -- long list is O(n)): whichever entry is claimed first starts the run,
    -- and the claim of the other finds the run started or over.
    if is_person(src) and status == 'queued' and r.lane ~= 'p' and not delayed then
      if r.entry and r.entry ~= '' then
        put('entry', enqueue(a.q, 'p', cur, a.key, src))
      else
        put('plane', 'p')
      end
      put('lane', 'p')
      changed = true
    end
    if changed then put('updatedAt', now) end
    outcome = 'joined'
  elseif a.policy == 'skip' then
    coalesce('skipped', 'skipped', vals[1], vals[2], cur)
    outcome = 'skipped'
  elseif a.policy == 'queue' then
    served = follow_up_run(r, a, put)
    follow_up_link(a, r.followUp)
    put('followUp', '1')
    put('followUpSources', list_add(r.followUpSources, src))
    put('updatedAt', now)
    coalesce('requested', 'queued', vals[1], vals[2], served)
    outcome, changed = 'queued', true
  else
    -- replace: the active run is cancelled through the registry and a
    -- fresh run follows. A run nobody executes (queued, or waiting for its
    -- retry backoff) is ended here; a running one is flagged, and its
    -- holder ends it as cancelled, which starts the follow-up. That run
    -- also serves the requests queued before (their sources stay its).
    served = follow_up_run(r, a, put)
    hist_push(hist, a.cap, hist_ev(now, 'requested', served, src, '', 'replaced'))
    follow_up_link(a, r.followUp)
    put('followUp', '1')
    put('followUpSources', list_add(r.followUpSources, src))
    if status == 'running' then
      put('cancel', '1')
      put('updatedAt', now)
      rcall(PUBLISH_CMD, a.tag .. ':cancels', cancel_payload(a.key, cur))
    else
      put('v', '')
      rcall('HSET', task, unpk(set))
      set = {}
      rcall('ZREM', part_of(a.tag).retry, cur .. ' ' .. a.key)
      finish_terminal({task = task, q = a.q, hist = hist, cap = a.cap,
        retention = a.retention, next_run_id = a.run_id, stages = a.stages,
        max_attempts = a.max_attempts, now = now, links_from = a.links_next, links_to = a.links_new}, 'cancelled', 'replaced')
      r = nil -- rewritten: the caller reads the view again
    end
    outcome, changed = 'replaced', true
  end
  if a.occ ~= '' then put(a.occ_field, a.occ) end
  if changed then put('v', '') end -- the cached view (submit_fast)
  if #set > 0 then rcall('HSET', task, unpk(set)) end
  if changed then publish(a.part, task) end
  if not r then return outcome, nil, served end -- rewritten: the caller reads the view
  return outcome, '\30' .. view_reply(r), served
end
