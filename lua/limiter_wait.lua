-- limiter_wait: a run's request waits for a limiter. Its record, still
-- queued (no attempt counted), says why in 'waiting'; its entry stays
-- taken, reclaimable only after recheck ms: the limiter reserves a freed
-- slot for it and a runner claims it then, and the reclaim after recheck
-- only re-asks the limiter (nothing is parked for good).
-- KEYS[1] task record   KEYS[2] partition's taken set   KEYS[3] watch key
-- ARGV[1] runId   ARGV[2] the entry   ARGV[3] why   ARGV[4] recheck (ms)
-- ARGV[5] events channel
-- returns 1, or 0 when the run is no longer the one queued
local v = rcall('HMGET', KEYS[1], 'runId', 'status', 'waiting')
if v[1] ~= ARGV[1] or not (v[2] == 'queued' or v[2] == 'retrying') then return 0 end
local now = now_ms()
local at = tonum(now) + tonum(ARGV[4])
rcall('ZADD', KEYS[2], 'XX', at, ARGV[2])
mark_due('t', {taken = KEYS[2]}, at, now)
if v[3] ~= ARGV[3] then
  rcall('HSET', KEYS[1], 'waiting', ARGV[3], 'v', '')
  publish({events = ARGV[5], watch = KEYS[3]}, KEYS[1])
end
return 1
