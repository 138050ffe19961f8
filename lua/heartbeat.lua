-- heartbeat: renew the lease, keep the request entry from being reclaimed,
-- and report a cancel request, in one round trip.
-- KEYS[1] lease   KEYS[2] task record   KEYS[3] request stream
-- ARGV[1] owner (and consumer name)   ARGV[2] token   ARGV[3] runId
-- ARGV[4] lease ttl (ms)   ARGV[5] group   ARGV[6] entry id
-- returns {1, cancel flag ('1' or '0')}   or {0} when not held
if not fenced(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]) then return {0} end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
-- XCLAIM with min-idle 0 resets the entry's idle time (and takes it back if
-- another runner reclaimed it while the lease was live).
redis.call('XCLAIM', KEYS[3], ARGV[5], ARGV[1], 0, ARGV[6], 'JUSTID')
return {1, redis.call('HGET', KEYS[2], 'cancel') or '0'}
