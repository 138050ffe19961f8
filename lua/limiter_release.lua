-- limiter_release: a run ends (or its claim was not granted) and gives
-- back the slots it holds of one limiter; the freed slots go at once to
-- the best waiting members (lib/limiters.lua lim_pump), reserved for
-- owner, up to the count asked: the runner that frees a slot runs the
-- next waiting run, so a freed slot wakes exactly one runner. With no
-- slot given it is the pump of a runner that looks for waiting runs.
-- KEYS[1] the limiter's hash
-- ARGV[1] configuration (lim_open)   ARGV[2] owner   ARGV[3] slot ttl (ms)
-- ARGV[4] waiting members to reserve slots for (0 or more)
-- ARGV[5] hold (ms): the limiter holds its starts until now + hold
--         (holdOnRetryAfter), 0 none
-- ARGV[6] '0': the starts being given back ran; '1': they never ran
--         (their claims were not granted): their rate is refunded; 'w':
--         they never ran and their members wait again, first in line
--         (a reserved run whose claim failed: lib/limiters.lua lim_release)
-- ARGV[7] with 'w', the members' fair-share group
-- ARGV[8] the runner's token floor (jobs/tokenfloor.go; '' none): the
--         tokens of the slots reserved are above it
-- then per slot 3 values: slot number (-1: a rate-only limiter), token,
-- member
-- returns {reserved, look again in (ms, by Redis
--   time: a runner's clock may differ; 0 when none waits), waiting}
local l = lim_open(KEYS[1], ARGV[1], ARGV[3], ARGV[8])
local owner = ARGV[2]
lim_hold(l, tonum(ARGV[5]))
local again = nil
if ARGV[6] == 'w' then again = ARGV[7] end
for j = 9, #ARGV, 3 do
  lim_release(l, ARGV[j], ARGV[j + 1], ARGV[j + 2], owner, ARGV[6] ~= '0', again)
end
local reserved = {}
local next_at, left = lim_pump(l, owner, tonum(ARGV[4]), reserved)
lim_close(l)
return {reserved, lim_in(l, next_at), left}
