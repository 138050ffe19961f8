-- heartbeat: renew the lease, keep the request entry from being reclaimed,
-- and report a cancel request, in one round trip.
-- KEYS[1] lease   KEYS[2] task record   KEYS[3] partition's taken set
-- ARGV[1] owner   ARGV[2] token   ARGV[3] runId   ARGV[4] lease ttl (ms)
-- ARGV[5] reclaim idle (ms)   ARGV[6] the run's entry
-- returns {1, cancel flag ('1' or '0')}   or {0} when not held
if not fenced(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]) then return {0} end
rcall('PEXPIRE', KEYS[1], ARGV[4])
-- The entry becomes reclaimable a reclaim idle time from now (XX: an entry
-- a cancel or a reclaim already acknowledged stays gone).
rcall('ZADD', KEYS[3], 'XX', now_ms() + tonum(ARGV[5]), ARGV[6])
return {1, rcall('HGET', KEYS[2], 'cancel') or '0'}
