-- lib.lua: helpers prepended to every tasklease script (see lua.go).
-- Nothing here runs on its own; each function documents what it touches, and
-- callers pass every key through KEYS so scripts stay Redis Cluster safe.

-- now_ms returns Redis server time in milliseconds: expiry and every
-- timestamp come from Redis, never from a runner's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- lease_value is what a lease key holds: "<token>|<owner>".
local function lease_value(token, owner)
  return tostring(token) .. '|' .. owner
end

-- lease_held reports whether lease_key is held by owner with token.
local function lease_held(lease_key, owner, token)
  return redis.call('GET', lease_key) == lease_value(token, owner)
end

-- lease_grant takes a free lease: SET NX PX, then INCR of the fence counter
-- for the token. Returns token, or nil, holder value, remaining ms.
local function lease_grant(lease_key, fence_key, owner, ttl_ms)
  local cur = redis.call('GET', lease_key)
  if cur then
    return nil, cur, redis.call('PTTL', lease_key)
  end
  local token = redis.call('INCR', fence_key)
  redis.call('SET', lease_key, lease_value(token, owner), 'PX', ttl_ms)
  return token
end

-- hist_add appends one event to a task's capped history stream.
-- fields: a flat list {name, value, ...} appended after at/event/runId.
local function hist_add(hist_key, cap, now, event, run_id, fields)
  local args = {'XADD', hist_key, 'MAXLEN', '~', cap, '*', 'at', now, 'event', event, 'runId', run_id or ''}
  for i = 1, #fields do args[#args + 1] = fields[i] end
  redis.call(unpack(args))
end

-- publish_view publishes the task record (minus the binary cursor) as JSON
-- on the partition's channel; subscribers turn it into a TaskView.
local function publish_view(task_key, channel)
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
  return rec[1] == run_id and rec[2] == tostring(token)
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
  local rec = redis.call('HMGET', task_key, 'runId', 'done', 'cursor', 'stages')
  local done, cursor, stages_now
  if rec[1] ~= run_id then
    done, cursor, stages_now = 0, '', stages_csv
    redis.call('HSET', task_key, 'runId', run_id, 'stages', stages_csv, 'done', 0, 'cursor', '',
      'attempt', 0, 'startedAt', now, 'finishedAt', '', 'lastError', '', 'cancel', '0')
  else
    done, cursor, stages_now = tonumber(rec[2]) or 0, rec[3] or '', rec[4] or stages_csv
  end
  local stages = split(stages_now, ',')
  local stage = stages[done + 1] or ''
  local attempt = redis.call('HINCRBY', task_key, 'attempt', 1)
  redis.call('HSET', task_key, 'status', 'running', 'stage', stage, 'owner', owner,
    'token', token, 'updatedAt', now, 'nextAttemptAt', '')
  return done, stage, cursor, attempt
end
