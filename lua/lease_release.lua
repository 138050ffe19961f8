-- lease_release: delete a lease only if owner and token still match.
-- KEYS[1] lease key
-- ARGV[1] owner   ARGV[2] token
-- returns 1 released, 0 not held
if not lease_held(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
rcall('DEL', KEYS[1])
return 1
