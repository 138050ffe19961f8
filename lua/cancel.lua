-- cancel: cancel a task's active run through the registry. A run nobody
-- executes is ended here; a running one gets a persisted cancel flag and a
-- publish on the cancel channel, and its holder ends it as cancelled. A
-- queued follow-up is dropped too: the user asked for the task to stop.
-- KEYS[1] task record   KEYS[2] bulk request stream   KEYS[3] history
-- KEYS[4] partition index   KEYS[5] partition retry queue
-- KEYS[6] partition watch key (views are published only while it exists)
-- KEYS[7] people request stream
-- ARGV[1] group   ARGV[2] history cap   ARGV[3] events channel
-- ARGV[4] cancel channel (payload "<task key> <runId>")   ARGV[5] retention (ms)   ARGV[6] requester source
-- returns 'cancelled' | 'cancelling' | 'not_running'
local task = KEYS[1]
local rec = redis.call('HMGET', task, 'status', 'runId', 'key')
local status = rec[1]
if not (status == 'queued' or status == 'running' or status == 'retrying') then return 'not_running' end
local now = now_ms()
redis.call('HSET', task, 'followUp', '0', 'followUpSources', '', 'v', '')
if status == 'running' then
  redis.call('HSET', task, 'cancel', '1', 'updatedAt', now, 'v', '')
  publish_view(task, ARGV[3], KEYS[6])
  redis.call(PUBLISH_CMD, ARGV[4], cancel_payload(rec[3], rec[2]))
  return 'cancelling'
end
redis.call('ZREM', KEYS[5], rec[2] .. ' ' .. rec[3])
finish_terminal({task = task, streams = {b = KEYS[2], p = KEYS[7]}, hist = KEYS[3], index = KEYS[4],
  group = ARGV[1], cap = ARGV[2], retention = ARGV[5], next_run_id = '', now = now}, 'cancelled', 'cancelled by ' .. ARGV[6])
publish_view(task, ARGV[3], KEYS[6])
return 'cancelled'
