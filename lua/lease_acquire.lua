-- lease_acquire: grant a free lease and bump the key's fencing token.
-- KEYS[1] lease key   KEYS[2] fence counter
-- ARGV[1] owner       ARGV[2] ttl (ms)
-- returns {1, token}                  granted
--         {0, "<token>|<owner>", pttl} held by someone else
local token, holder, pttl = lease_grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if token then return {1, token} end
return {0, holder, pttl}
