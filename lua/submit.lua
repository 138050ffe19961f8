-- submit: route one TaskStartRequest through the registry. Dedup is by task
-- key only; the source is recorded, never compared.
-- KEYS[1] task record   KEYS[2] partition request stream   KEYS[3] history
-- KEYS[4] partition index   KEYS[5] partition subjects set of the scope
-- KEYS[6] partition retry queue
-- KEYS[7] partition watch key (views are published only while it exists)
-- ARGV[1] task key   ARGV[2] subject   ARGV[3] source   ARGV[4] policy
-- ARGV[5] new run id   ARGV[6] stages (comma list)   ARGV[7] maxAttempts
-- ARGV[8] minInterval (ms, 0 = none)   ARGV[9] history cap
-- ARGV[10] events channel   ARGV[11] cancel channel   ARGV[12] group
-- ARGV[13] retention (ms)
-- returns {outcome, HGETALL of the record after the request}
--   outcome: started | joined | queued | skipped | replaced | throttled
local task, stream, hist, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key, source, policy, run_id = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local cap = ARGV[9]
local now = now_ms()
redis.call('SADD', KEYS[5], ARGV[2])

local rec = redis.call('HMGET', task, 'status', 'runId', 'lastSuccessAt', 'sources', 'followUpSources')
local status = rec[1]
local active = status == 'queued' or status == 'running' or status == 'retrying'

local function result(outcome)
  return {outcome, redis.call('HGETALL', task)}
end

if not active then
  local min_interval = tonumber(ARGV[8])
  local last = tonumber(rec[3])
  if min_interval > 0 and last and (source == 'schedule' or source == 'foreground')
      and now - last < min_interval then
    hist_add(hist, cap, now, 'throttled', rec[2] or '', {'source', source, 'outcome', 'throttled'})
    return result('throttled')
  end
  if not status then
    redis.call('HSET', task, 'key', key, 'subject', ARGV[2], 'scope', string.sub(key, #ARGV[2] + 2))
  end
  new_run(task, stream, hist, key, run_id, ARGV[6], ARGV[7], source, source, now)
  hist_add(hist, cap, now, 'requested', run_id, {'source', source, 'outcome', 'started'})
  redis.call('ZADD', index, now, key)
  publish_view(task, ARGV[10], KEYS[7])
  return result('started')
end

local cur = rec[2]
if policy == 'join' then
  redis.call('HSET', task, 'sources', add_source(rec[4], source), 'updatedAt', now)
  hist_add(hist, cap, now, 'joined', cur, {'source', source, 'outcome', 'joined'})
  publish_view(task, ARGV[10], KEYS[7])
  return result('joined')
elseif policy == 'skip' then
  hist_add(hist, cap, now, 'skipped', cur, {'source', source, 'outcome', 'skipped'})
  return result('skipped')
elseif policy == 'queue' then
  redis.call('HSET', task, 'followUp', '1', 'followUpSources', add_source(rec[5], source), 'updatedAt', now)
  hist_add(hist, cap, now, 'requested', cur, {'source', source, 'outcome', 'queued'})
  publish_view(task, ARGV[10], KEYS[7])
  return result('queued')
end

-- replace: the active run is cancelled through the registry and a fresh run
-- follows. A run nobody executes yet is ended here; a running one is
-- flagged, and its holder ends it as cancelled, which starts the follow-up.
hist_add(hist, cap, now, 'requested', cur, {'source', source, 'outcome', 'replaced'})
redis.call('HSET', task, 'followUp', '1', 'followUpSources', source)
if status == 'running' then
  redis.call('HSET', task, 'cancel', '1', 'updatedAt', now)
  publish_view(task, ARGV[10], KEYS[7])
  redis.call('PUBLISH', ARGV[11], key)
else
  redis.call('ZREM', KEYS[6], cur .. ' ' .. key)
  finish_terminal({task = task, stream = stream, hist = hist, index = index, group = ARGV[12], cap = cap,
    channel = ARGV[10], retention = ARGV[13], next_run_id = run_id, now = now}, 'cancelled', 'replaced')
  publish_view(task, ARGV[10], KEYS[7])
end
return result('replaced')
