-- lease_renew: extend a lease only if owner and token still match. Unlike a
-- bare PEXPIRE it can never extend a lease someone else was granted.
-- KEYS[1] lease key
-- ARGV[1] owner   ARGV[2] token   ARGV[3] ttl (ms)
-- returns 1 renewed, 0 not held
if not lease_held(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
rcall('PEXPIRE', KEYS[1], ARGV[3])
return 1
