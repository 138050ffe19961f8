-- checkpoint_begin: the lease holder takes over the run record of its key.
-- A record of another run is reset; the same run keeps its checkpoint.
-- KEYS[1] lease key   KEYS[2] task record   KEYS[3] history
-- KEYS[4] partition watch key (views are published only while it exists)
-- ARGV[1] owner   ARGV[2] token   ARGV[3] runId   ARGV[4] stages (comma list)
-- ARGV[5] history cap   ARGV[6] events channel
-- ARGV[7] task key   ARGV[8] subject   ARGV[9] scope
-- returns {1, done, stage, cursor, attempt, stages, startedAt, updatedAt}
--         {0} when the lease is not held
if not lease_held(KEYS[1], ARGV[1], ARGV[2]) then return {0} end
local now = now_ms()
rcall('HSET', KEYS[2], 'key', ARGV[7], 'subject', ARGV[8], 'scope', ARGV[9])
local done, stage, cursor, attempt = cp_begin(KEYS[2], ARGV[3], ARGV[4], ARGV[1], ARGV[2], now)
hist_push(KEYS[3], ARGV[5], hist_ev(now, 'started', ARGV[3], '', stage, '', ARGV[1], ARGV[2]))
publish_view(KEYS[2], ARGV[6], KEYS[4])
local rec = rcall('HMGET', KEYS[2], 'stages', 'startedAt', 'updatedAt')
return {1, done, stage, cursor, attempt, rec[1], rec[2], rec[3]}
