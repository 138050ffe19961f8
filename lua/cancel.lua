-- cancel: cancel a task's active run through the registry. A run nobody
-- executes is ended here; a running one gets a persisted cancel flag and a
-- publish on the cancel channel, and its holder ends it as cancelled. A
-- queued follow-up is dropped too: the user asked for the task to stop;
-- the requests it would have served (logged under its id) are told by a
-- cancelled event of that id, and their coalesced counts are folded into
-- the history now (a follow-up queued next gets a new id, and its first
-- request of a source must not count on the dropped one's).
-- KEYS[1] task record   KEYS[2] history
-- KEYS[3] partition retry queue
-- KEYS[4] partition watch key (views are published only while it exists)
-- KEYS[5..8] the partition's queue keys (lib/queues.lua queue_at)
-- ARGV[1] history cap   ARGV[2] events channel
-- ARGV[3] cancel channel (payload "<task key> <runId>")   ARGV[4] retention (ms)   ARGV[5] requester source
-- returns 'cancelled' | 'cancelling' | 'not_running'
local task = KEYS[1]
local rec = rcall('HMGET', task, 'status', 'runId', 'key', 'followUp', 'followUpRunId', 'co')
local status = rec[1]
if not (status == 'queued' or status == 'running' or status == 'retrying') then return 'not_running' end
local now = now_ms()
rcall('HSET', task, 'followUp', '0', 'followUpSources', '', 'v', '')
if rec[4] == '1' and rec[5] then
  co_fold(task, KEYS[2], rec[6], 'queued')
  hist_push(KEYS[2], ARGV[1], hist_err(now, 'cancelled', rec[5], '', '', '', '',
    'cancelled by ' .. ARGV[5] .. ' before it started'))
end
if status == 'running' then
  rcall('HSET', task, 'cancel', '1', 'updatedAt', now, 'v', '')
  publish_view(task, ARGV[2], KEYS[4])
  rcall(PUBLISH_CMD, ARGV[3], cancel_payload(rec[3], rec[2]))
  return 'cancelling'
end
rcall('ZREM', KEYS[3], rec[2] .. ' ' .. rec[3])
finish_terminal({task = task, q = queue_at(KEYS, 5), hist = KEYS[2],
  cap = ARGV[1], retention = ARGV[4], next_run_id = '', now = now}, 'cancelled', 'cancelled by ' .. ARGV[5])
publish_view(task, ARGV[2], KEYS[4])
return 'cancelled'
