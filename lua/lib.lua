-- lib.lua: helpers prepended to every tasklease script (see lua.go).
-- Nothing here runs on its own; each function documents what it touches, and
-- callers pass every key through KEYS so scripts stay Redis Cluster safe.

-- now_ms returns Redis server time in milliseconds: expiry and every
-- timestamp come from Redis, never from a runner's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- tok_str formats a fencing token (or any integer number) for Redis: Lua's
-- tostring gives "1.7e+15" for microsecond tokens.
local function tok_str(n)
  if type(n) == 'string' then return n end
  return string.format('%.0f', n)
end

-- lease_value is what a lease key holds: "<token>|<owner>".
local function lease_value(token, owner)
  return tok_str(token) .. '|' .. owner
end

-- lease_held reports whether lease_key is held by owner with token.
local function lease_held(lease_key, owner, token)
  return redis.call('GET', lease_key) == lease_value(token, owner)
end

-- lease_grant takes a free lease (SET PX) with the next fencing token:
-- max(previous token + 1, Redis TIME in microseconds). The time floor keeps
-- tokens monotonic when Redis loses the fence counter (restart without
-- persistence, failover to a lagging replica, a flush), so the counter may
-- expire (fence_ttl_ms) with the record it fences. Tokens stay below 2^53.
-- Returns token (a number), or nil, holder value, remaining ms.
local function lease_grant(lease_key, fence_key, owner, ttl_ms, fence_ttl_ms)
  local cur = redis.call('GET', lease_key)
  if cur then
    return nil, cur, redis.call('PTTL', lease_key)
  end
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max((tonumber(redis.call('GET', fence_key)) or 0) + 1, now_us)
  redis.call('SET', fence_key, tok_str(token), 'PX', fence_ttl_ms)
  redis.call('SET', lease_key, lease_value(token, owner), 'PX', ttl_ms)
  return token
end

-- hist_add appends one event to a task's capped history stream.
-- fields: a flat list {name, value, ...} appended after at/event/runId.
local function hist_add(hist_key, cap, now, event, run_id, fields)
  redis.call('XADD', hist_key, 'MAXLEN', '~', cap, '*', 'at', now, 'event', event, 'runId', run_id or '',
    unpack(fields))
end

-- publish_view publishes the task record (minus the binary cursor) as JSON
-- on the partition's channel; subscribers turn it into a TaskView. It is
-- skipped while watch_key is absent: subscribers (Registry.Subscribe) keep
-- that key alive, and encoding views nobody reads costs a third of a
-- script's time.
local function publish_view(task_key, channel, watch_key)
  if redis.call('EXISTS', watch_key) == 0 then return end
  local flat = redis.call('HGETALL', task_key)
  local view = {}
  for i = 1, #flat, 2 do
    if flat[i] ~= 'cursor' then view[flat[i]] = flat[i + 1] end
  end
  redis.call('PUBLISH', channel, cjson.encode(view))
end

-- fenced reports whether the caller may write the run record: it holds the
-- lease with this token, and the record is still this run's, at this token.
local function fenced(lease_key, task_key, owner, token, run_id)
  if not lease_held(lease_key, owner, token) then return false end
  local rec = redis.call('HMGET', task_key, 'runId', 'token')
  return rec[1] == run_id and rec[2] == tok_str(token)
end

-- split splits s on sep (a single plain character); "" gives {}.
local function split(s, sep)
  local out = {}
  if s == nil or s == false or s == '' then return out end
  local start = 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- cp_begin hands the run record of task_key to a new lease holder. A record
-- of another run starts a fresh checkpoint; the same run keeps its completed
-- stages and cursor (recovery resumes). Returns done, stage, cursor, attempt.
local function cp_begin(task_key, run_id, stages_csv, owner, token, now)
  local rec = redis.call('HMGET', task_key, 'runId', 'done', 'cursor', 'stages', 'startedAt')
  local done, cursor, stages_now
  if rec[1] ~= run_id then
    done, cursor, stages_now = 0, '', stages_csv
    redis.call('HSET', task_key, 'runId', run_id, 'stages', stages_csv, 'done', 0, 'cursor', '',
      'attempt', 0, 'startedAt', now, 'finishedAt', '', 'lastError', '', 'cancel', '0')
  else
    done, cursor, stages_now = tonumber(rec[2]) or 0, rec[3] or '', rec[4] or stages_csv
    if not rec[5] or rec[5] == '' then redis.call('HSET', task_key, 'startedAt', now) end
  end
  local stages = split(stages_now, ',')
  local stage = stages[done + 1] or ''
  local attempt = redis.call('HINCRBY', task_key, 'attempt', 1)
  redis.call('HSET', task_key, 'status', 'running', 'stage', stage, 'owner', owner,
    'token', tok_str(token), 'updatedAt', now, 'nextAttemptAt', '', 'waiting', '')
  return done, stage, cursor, attempt
end

-- ack_entry acknowledges and deletes a request stream entry: deleting keeps
-- the stream small without MAXLEN trimming, which could drop pending entries.
local function ack_entry(stream_key, group, entry_id)
  if entry_id and entry_id ~= '' then
    redis.call('XACK', stream_key, group, entry_id)
    redis.call('XDEL', stream_key, entry_id)
  end
end

-- add_source appends src to a comma list unless present.
local function add_source(list, src)
  if list == nil or list == false or list == '' then return src end
  for _, s in ipairs(split(list, ',')) do
    if s == src then return list end
  end
  return list .. ',' .. src
end

-- new_run creates a queued run on task_key and appends its request to the
-- partition stream, in the same script: a run record never exists without
-- its request, nor a request without its record (no orphans).
local function new_run(task_key, stream_key, hist_key, key, run_id, stages_csv, max_attempts, sources, source, now)
  local id = redis.call('XADD', stream_key, '*', 'key', key, 'runId', run_id, 'source', source)
  redis.call('HSET', task_key, 'runId', run_id, 'status', 'queued', 'stages', stages_csv, 'done', 0,
    'stage', '', 'cursor', '', 'attempt', 0, 'maxAttempts', max_attempts, 'sources', sources,
    'owner', '', 'token', '', 'requestedAt', now, 'startedAt', '', 'updatedAt', now, 'finishedAt', '',
    'nextAttemptAt', '', 'lastError', '', 'cancel', '0', 'followUp', '0', 'followUpSources', '',
    'entry', id, 'waiting', '')
  redis.call('PERSIST', task_key)
  redis.call('PERSIST', hist_key)
  return id
end

-- finish_terminal ends the current run as done, failed or cancelled: it
-- acknowledges its request, records the result, and starts the queued
-- follow-up if there is one; otherwise record and history expire after the
-- retention. A follow-up is a new run: it takes the job's current
-- definition (c.stages, c.max_attempts, from the caller's registry), not the
-- ended run's; c.stages '' (a caller that does not define the job) keeps the
-- ended run's. The caller has already released (or never held) the lease.
-- c: {task, stream, hist, index, group, cap, channel, retention, next_run_id,
--     stages, max_attempts, now}
local function finish_terminal(c, result, err)
  local rec = redis.call('HMGET', c.task, 'entry', 'runId', 'key', 'followUp', 'followUpSources',
    'stages', 'maxAttempts', 'stage', 'owner', 'token')
  ack_entry(c.stream, c.group, rec[1])
  local fields = {'status', result, 'finishedAt', c.now, 'updatedAt', c.now, 'stage', '',
    'lastError', err or '', 'cancel', '0', 'entry', '', 'nextAttemptAt', '', 'waiting', ''}
  if result == 'done' then
    fields[#fields + 1] = 'lastSuccessAt'
    fields[#fields + 1] = c.now
  end
  redis.call('HSET', c.task, unpack(fields))
  hist_add(c.hist, c.cap, c.now, result, rec[2], {'stage', rec[8] or '', 'error', err or '',
    'owner', rec[9] or '', 'fencingToken', rec[10] or ''})
  redis.call('ZADD', c.index, c.now, rec[3])
  if rec[4] == '1' and c.next_run_id ~= '' then
    local srcs = rec[5]
    local first = split(srcs, ',')[1] or 'manual'
    local stages, max_attempts = rec[6], rec[7]
    if c.stages and c.stages ~= '' then stages, max_attempts = c.stages, c.max_attempts end
    new_run(c.task, c.stream, c.hist, rec[3], c.next_run_id, stages, max_attempts, srcs, first, c.now)
    hist_add(c.hist, c.cap, c.now, 'requested', c.next_run_id, {'source', first, 'outcome', 'started'})
  elseif tonumber(c.retention) > 0 then
    redis.call('PEXPIRE', c.task, c.retention)
    redis.call('PEXPIRE', c.hist, c.retention)
  end
end

-- cancel_payload is what the cancel channel carries: "<task key> <runId>",
-- so a late message never stops a newer run of the key.
local function cancel_payload(key, run_id)
  return key .. ' ' .. run_id
end

-- submit_one routes one TaskStartRequest (see submit.lua for the rules).
-- Dedup is by task key only; the source is recorded, never compared.
-- a: {task, hist, stream, index, subjects, retry, watch (keys);
--     key, subject, source, policy, run_id, stages, max_attempts,
--     min_interval (ms), cap, events, cancels, group, retention (ms),
--     occ_field, occ (a schedule occurrence: '' for none), now}
-- returns the outcome: started | joined | queued | skipped | replaced |
-- throttled, or duplicate when occ_field already holds occ or a later
-- occurrence (unix seconds) — this occurrence already reached the key, or a
-- newer one did; nothing is written.
local function submit_one(a)
  local task, hist, now = a.task, a.hist, a.now
  -- A repeat of this occurrence, or a late batch of an older one (a leader
  -- paused past its term), writes nothing: occurrences only move forward.
  if a.occ ~= '' and (tonumber(redis.call('HGET', task, a.occ_field)) or -1) >= tonumber(a.occ) then
    return 'duplicate'
  end
  -- "subjects: all" means every subject people or apps asked for within
  -- the retention: schedule requests do not keep a subject in the set.
  if a.source ~= 'schedule' then redis.call('ZADD', a.subjects, now, a.subject) end
  local outcome
  local rec = redis.call('HMGET', task, 'status', 'runId', 'lastSuccessAt', 'sources', 'followUpSources')
  local status = rec[1]
  local active = status == 'queued' or status == 'running' or status == 'retrying'
  local cur = rec[2]
  if not active then
    local last = tonumber(rec[3])
    if a.min_interval > 0 and last and (a.source == 'schedule' or a.source == 'foreground')
        and now - last < a.min_interval then
      hist_add(hist, a.cap, now, 'throttled', cur or '', {'source', a.source, 'outcome', 'throttled'})
      outcome = 'throttled'
    else
      if not status then
        redis.call('HSET', task, 'key', a.key, 'subject', a.subject, 'scope', string.sub(a.key, #a.subject + 2))
      end
      new_run(task, a.stream, hist, a.key, a.run_id, a.stages, a.max_attempts, a.source, a.source, now)
      hist_add(hist, a.cap, now, 'requested', a.run_id, {'source', a.source, 'outcome', 'started'})
      redis.call('ZADD', a.index, now, a.key)
      publish_view(task, a.events, a.watch)
      outcome = 'started'
    end
  elseif a.policy == 'join' then
    redis.call('HSET', task, 'sources', add_source(rec[4], a.source), 'updatedAt', now)
    hist_add(hist, a.cap, now, 'joined', cur, {'source', a.source, 'outcome', 'joined'})
    publish_view(task, a.events, a.watch)
    outcome = 'joined'
  elseif a.policy == 'skip' then
    hist_add(hist, a.cap, now, 'skipped', cur, {'source', a.source, 'outcome', 'skipped'})
    outcome = 'skipped'
  elseif a.policy == 'queue' then
    redis.call('HSET', task, 'followUp', '1', 'followUpSources', add_source(rec[5], a.source), 'updatedAt', now)
    hist_add(hist, a.cap, now, 'requested', cur, {'source', a.source, 'outcome', 'queued'})
    publish_view(task, a.events, a.watch)
    outcome = 'queued'
  else
    -- replace: the active run is cancelled through the registry and a
    -- fresh run follows. A run nobody executes (queued, or waiting for its
    -- retry backoff) is ended here; a running one is flagged, and its
    -- holder ends it as cancelled, which starts the follow-up.
    hist_add(hist, a.cap, now, 'requested', cur, {'source', a.source, 'outcome', 'replaced'})
    redis.call('HSET', task, 'followUp', '1', 'followUpSources', a.source)
    if status == 'running' then
      redis.call('HSET', task, 'cancel', '1', 'updatedAt', now)
      publish_view(task, a.events, a.watch)
      redis.call('PUBLISH', a.cancels, cancel_payload(a.key, cur))
    else
      redis.call('ZREM', a.retry, cur .. ' ' .. a.key)
      finish_terminal({task = task, stream = a.stream, hist = hist, index = a.index, group = a.group, cap = a.cap,
        channel = a.events, retention = a.retention, next_run_id = a.run_id, stages = a.stages,
        max_attempts = a.max_attempts, now = now}, 'cancelled', 'replaced')
      publish_view(task, a.events, a.watch)
    end
    outcome = 'replaced'
  end
  if a.occ ~= '' then redis.call('HSET', task, a.occ_field, a.occ) end
  return outcome
end

-- recovery_mode mirrors checkpoints.Decide for the history event of a
-- recovered run: restart, resume or skip.
local function recovery_mode(done, cursor, n_stages)
  if done == 0 and (cursor == nil or cursor == '') then return 'restart' end
  if done >= n_stages then return 'skip' end
  return 'resume'
end
