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
-- Cost: GET lease, HMGET of 6 fields, TIME, HSET of 3 fields (5 when the
-- stage left a cursor or the record caches its view: an empty field is
-- cleared only when set — a field read costs less than one written, and
-- an empty one would enlarge every later search of the record), RPUSH,
-- EXISTS watch.
if not lease_held(KEYS[1], ARGV[1], ARGV[2]) then return {0} end
local rec = rcall('HMGET', KEYS[2], 'runId', 'token', 'stages', 'done', 'cursor', 'v')
if rec[1] ~= ARGV[3] or rec[2] ~= ARGV[2] then return {0} end
local done = small_num(rec[4]) or 0
if list_at(rec[3], done + 1) ~= ARGV[4] then return {-1} end
local nxt = list_at(rec[3], done + 2)
local now = now_ms()
local f = {'done', int_str(done + 1), 'stage', nxt, 'updatedAt', now}
if rec[5] and rec[5] ~= '' then f[7], f[8] = 'cursor', '' end
if rec[6] and rec[6] ~= '' then f[#f + 1], f[#f + 2] = 'v', '' end
rcall('HSET', KEYS[2], unpk(f))
hist_push(KEYS[3], ARGV[5], hist_ev(now, 'stage', ARGV[3], '', ARGV[4], 'done', ARGV[1], ARGV[2]))
publish_view(KEYS[2], ARGV[6], KEYS[4])
return {1, nxt}
