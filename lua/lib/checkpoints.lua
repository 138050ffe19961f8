-- lib/checkpoints.lua: the standalone checkpoint API's fence and hand-over
-- (package checkpoints; the engine's claim does the same inline).

-- fenced reports whether the caller may write the run record: it holds the
-- lease with this token, and the record is still this run's, at this token.
local function fenced(lease_key, task_key, owner, token, run_id)
  if not lease_held(lease_key, owner, token) then return false end
  local rec = rcall('HMGET', task_key, 'runId', 'token')
  return rec[1] == run_id and rec[2] == tok_str(token)
end

-- cp_begin hands the run record of task_key to a new lease holder (the
-- standalone checkpoint API, checkpoint_begin.lua; the engine's claim.lua
-- does the same inline). A record of another run starts a fresh checkpoint;
-- the same run keeps its completed stages and cursor (recovery resumes).
-- Returns done, stage, cursor, attempt.
local function cp_begin(task_key, run_id, stages_csv, owner, token, now)
  local rec = rcall('HMGET', task_key, 'runId', 'done', 'cursor', 'stages', 'startedAt', 'status', 'finishedAt')
  local done, cursor, stages_now
  if rec[1] ~= run_id then
    done, cursor, stages_now = 0, '', stages_csv
    local f = {'runId', run_id, 'stages', stages_csv, 'done', '0', 'cursor', '',
      'attempt', '0', 'startedAt', now, 'finishedAt', '', 'lastError', '', 'cancel', '0', 'v', ''}
    -- an engine run that ended done keeps its time in finishedAt alone
    -- (finish_terminal): moved to lastSuccessAt, as new_run does
    if rec[6] == 'done' and rec[7] and rec[7] ~= '' then f[#f + 1], f[#f + 2] = 'lastSuccessAt', rec[7] end
    rcall('HSET', task_key, unpk(f))
  else
    done, cursor, stages_now = tonum(rec[2]) or 0, rec[3] or '', rec[4] or stages_csv
    if not rec[5] or rec[5] == '' then rcall('HSET', task_key, 'startedAt', now, 'v', '') end
  end
  local stages = split(stages_now, ',')
  local stage = stages[done + 1] or ''
  local attempt = rcall('HINCRBY', task_key, 'attempt', 1)
  rcall('HSET', task_key, 'status', 'running', 'stage', stage, 'owner', owner,
    'token', tok_str(token), 'updatedAt', now, 'nextAttemptAt', '', 'waiting', '', 'v', '')
  return done, stage, cursor, attempt
end
