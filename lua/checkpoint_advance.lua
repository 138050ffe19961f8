-- checkpoint_advance: mark the current stage done and enter the next one.
-- Fenced: only the lease holder of this run, at this token, may write.
-- KEYS[1] lease key   KEYS[2] task record   KEYS[3] history
-- KEYS[4] partition watch key (views are published only while it exists)
-- ARGV[1] owner   ARGV[2] token   ARGV[3] runId   ARGV[4] completed stage
-- ARGV[5] history cap   ARGV[6] events channel
-- returns {1, next stage ("" after the last)}
--         {0}   not held (lease lost, or the record moved on)
--         {-1}  the stage is not the run's current stage
-- Fenced as fenced() does, with the record read once.
if not lease_held(KEYS[1], ARGV[1], ARGV[2]) then return {0} end
local rec = rcall('HMGET', KEYS[2], 'runId', 'token', 'stages', 'done')
if rec[1] ~= ARGV[3] or rec[2] ~= ARGV[2] then return {0} end
local done = tonum(rec[4]) or 0
if list_at(rec[3], done + 1) ~= ARGV[4] then return {-1} end
local nxt = list_at(rec[3], done + 2)
local now = now_ms()
rcall('HSET', KEYS[2], 'done', int_str(done + 1), 'stage', nxt, 'cursor', '', 'updatedAt', now, 'v', '')
hist_push(KEYS[3], ARGV[5], hist_ev(now, 'stage', ARGV[3], '', ARGV[4], 'done', ARGV[1], ARGV[2]))
publish_view(KEYS[2], ARGV[6], KEYS[4])
return {1, nxt}
