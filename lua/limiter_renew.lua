-- limiter_renew: a run's heartbeat renews the slots it holds of one
-- limiter (lib/limiters.lua) to now + ttl, with its lease. A slot that is
-- now someone else's is not renewed: the run stops as on a lost lease.
-- (One that expired but nobody took is renewed: lim_slot_of.)
-- Cost: TIME, HGET, ZADD (and HSET the first time, for a reserved slot).
-- KEYS[1] the limiter's hash   ARGV[1] slot ttl (ms)   ARGV[2] owner
-- then per slot 3 values: slot number, token, member
-- returns 1 when every slot was renewed, else 0
local l = {base = KEYS[1], slots = KEYS[1] .. ':slots', holders = KEYS[1] .. ':holders', now = tonum(now_ms())}
local ok = 1
for j = 3, #ARGV, 3 do
  local i, token, member = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local h = lim_slot_of(l, i, member, ARGV[2], token)
  if not h then
    ok = 0
  else
    rcall('ZADD', l.slots, 'XX', l.now + tonum(ARGV[1]), i)
    if h[3] == 'r' then -- reserved: the run took it
      rcall('HSET', l.holders, i, h[1] .. US .. h[2] .. US .. 'h' .. US .. h[4] .. US .. h[5] .. US .. h[6])
    end
  end
end
return ok
