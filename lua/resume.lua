-- resume: resume a scope on one partition. Removes the scope from the
-- partition's paused set (from then on claim.lua grants its runs again) and
-- re-queues the runs claim.lua parked while it was paused, each on the lane
-- it was requested on, so they are claimed as if never paused. A parked run
-- that ended meanwhile (cancelled, replaced) or already has an entry again
-- is only dropped from the parked set. Go pages through the parked set
-- (ZRANGEBYLEX on "<scope> ") and calls this once per page, the first call
-- with no members if there are none: after that call nothing is parked for
-- the scope any more.
-- KEYS[1] partition's paused scopes (set)   KEYS[2] partition's parked runs
-- KEYS[3..6] the partition's queue keys (lib/queues.lua queue_at)
-- KEYS[7] partition watch key (views are published only while it exists)
-- KEYS[7+i] task record of parked member i
-- ARGV[1] scope   ARGV[2] events channel   ARGV[2+i] parked member i ("<scope> <subject>")
-- returns the number of runs re-queued
-- Cost per re-queued run: ZREM, HMGET, RPUSH, HSET, EXISTS watch.
rcall('SREM', KEYS[1], ARGV[1])
local queue = queue_at(KEYS, 3)
local requeued = 0
for i = 8, #KEYS do
  local task, member = KEYS[i], ARGV[i - 5]
  rcall('ZREM', KEYS[2], member)
  local rec = rcall('HMGET', task, 'key', 'runId', 'status', 'entry', 'psrc', 'plane', 'prun')
  local status = rec[3]
  -- prun: the run that was parked (a later run of the key was never parked)
  if (status == 'queued' or status == 'running' or status == 'retrying') and (rec[4] or '') == ''
      and rec[7] == rec[2] then
    local lane = rec[6] == 'p' and 'p' or 'b'
    local id = enqueue(queue, lane, rec[2], rec[1], rec[5] or 'retry')
    rcall('HSET', task, 'entry', id, 'waiting', '', 'v', '')
    publish_view(task, ARGV[2], KEYS[7])
    requeued = requeued + 1
  end
end
return requeued
