-- lease_acquire: grant a free lease with the key's next fencing token,
-- max(previous + 1, Redis TIME in µs) (see lease_grant in lib/base.lua).
-- KEYS[1] lease key   KEYS[2] fence counter
-- ARGV[1] owner       ARGV[2] ttl (ms)   ARGV[3] fence counter expiry (ms)
-- returns {1, token}                  granted
--         {0, "<token>|<owner>", pttl} held by someone else
local token, holder, pttl = lease_grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
if token then return {1, token} end
return {0, holder, pttl}
