-- checkpoint_progress: save a progress cursor inside the current stage, so a
-- recovered run resumes mid-stage. Fenced like checkpoint_advance.
-- KEYS[1] lease key   KEYS[2] task record   KEYS[3] history
-- KEYS[4] partition watch key (views are published only while it exists)
-- ARGV[1] owner   ARGV[2] token   ARGV[3] runId   ARGV[4] cursor (bytes)
-- ARGV[5] history cap   ARGV[6] events channel
-- returns 1 saved, 0 not held
if not fenced(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
local now = now_ms()
rcall('HSET', KEYS[2], 'cursor', ARGV[4], 'updatedAt', now, 'v', '')
local stage = rcall('HGET', KEYS[2], 'stage')
hist_push(KEYS[3], ARGV[5], hist_ev(now, 'progress', ARGV[3], '', stage, '', ARGV[1], ARGV[2]))
publish_view(KEYS[2], ARGV[6], KEYS[4])
return 1
