-- finish: end an attempt, fenced. Releases the lease, acknowledges the
-- request entry and records the result in one script, so a key is never left
-- blocked by a lease, record or entry without the others.
-- KEYS[1] task record   KEYS[2] lease   KEYS[3] request stream   KEYS[4] history
-- KEYS[5] partition index   KEYS[6] partition retry queue
-- KEYS[7] partition watch key (views are published only while it exists)
-- ARGV[1] owner   ARGV[2] token   ARGV[3] runId
-- ARGV[4] result: done | failed | cancelled | retry | handback
-- ARGV[5] stage completed by this call ("" if none)   ARGV[6] error text
-- ARGV[7] retry delay (ms)   ARGV[8] group   ARGV[9] history cap
-- ARGV[10] events channel   ARGV[11] retention (ms)   ARGV[12] follow-up run id
-- ARGV[13] the job's stages here (comma list) and ARGV[14] its maxAttempts:
--          the definition a follow-up run takes
-- A retry of a run whose cancel flag is set (a cancel or replace that landed
-- while this attempt was failing) ends it as cancelled at once instead of
-- waiting out the backoff.
-- returns {1, status after}   {0} not held   {-1} ARGV[5] is not the current stage
local task, lease_key, stream, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, token, run_id, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not fenced(lease_key, task, owner, token, run_id) then return {0} end
local now = now_ms()
local rec = redis.call('HMGET', task, 'stages', 'done', 'attempt', 'maxAttempts', 'entry', 'key', 'stage', 'sources',
  'cancel')
if ARGV[5] ~= '' then
  local done = tonumber(rec[2]) or 0
  local stages = split(rec[1], ',')
  if stages[done + 1] ~= ARGV[5] then return {-1} end
  redis.call('HSET', task, 'done', done + 1, 'cursor', '')
  if result == 'handback' then
    rec[7] = stages[done + 2] or ''
    redis.call('HSET', task, 'stage', rec[7])
  end
  hist_add(hist, ARGV[9], now, 'stage', run_id, {'stage', ARGV[5], 'outcome', 'done', 'owner', owner, 'fencingToken', token})
end
redis.call('DEL', lease_key)
local attempt, max_attempts = tonumber(rec[3]) or 1, tonumber(rec[4]) or 1
if result == 'retry' and rec[9] == '1' then
  result, ARGV[6] = 'cancelled', 'cancelled'
elseif result == 'retry' and attempt >= max_attempts then
  result = 'failed'
end

if result == 'retry' then
  local due = now + tonumber(ARGV[7])
  ack_entry(stream, ARGV[8], rec[5])
  redis.call('HSET', task, 'status', 'retrying', 'nextAttemptAt', due, 'lastError', ARGV[6],
    'entry', '', 'updatedAt', now)
  redis.call('ZADD', KEYS[6], due, run_id .. ' ' .. rec[6])
  hist_add(hist, ARGV[9], now, 'retry-scheduled', run_id, {'stage', rec[7], 'error', ARGV[6],
    'outcome', 'attempt ' .. attempt .. ' of ' .. max_attempts, 'owner', owner, 'fencingToken', token})
elseif result == 'handback' then
  -- Graceful shutdown: keep the checkpoint, give the attempt back and
  -- re-queue at once so another runner resumes without waiting for the TTL.
  ack_entry(stream, ARGV[8], rec[5])
  local first = split(rec[8], ',')[1] or 'manual'
  local id = redis.call('XADD', stream, '*', 'key', rec[6], 'runId', run_id, 'source', first)
  redis.call('HSET', task, 'status', 'queued', 'attempt', attempt - 1, 'entry', id, 'updatedAt', now)
  hist_add(hist, ARGV[9], now, 'handed-back', run_id, {'stage', rec[7], 'owner', owner, 'fencingToken', token})
else
  finish_terminal({task = task, stream = stream, hist = hist, index = KEYS[5], group = ARGV[8], cap = ARGV[9],
    channel = ARGV[10], retention = ARGV[11], next_run_id = ARGV[12], stages = ARGV[13],
    max_attempts = ARGV[14], now = now}, result, ARGV[6])
end
publish_view(task, ARGV[10], KEYS[7])
return {1, redis.call('HGET', task, 'status')}
