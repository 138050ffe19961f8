-- runner_beat: refresh this runner's presence record (GET /v1/runners) and
-- drop the records of runners gone longer than the keep time, so the
-- registry is bounded by the runners of the last hour.
-- KEYS[1] runners hash (owner → JSON record)
-- KEYS[2] last beats (sorted set: owner → Redis time in ms)
-- KEYS[3] the fleet's token floor: the highest fencing token any runner
--         reported (jobs/tokenfloor.go)
-- ARGV[1] owner   ARGV[2] the JSON record   ARGV[3] keep (ms)
-- ARGV[4] '1': also drop gone runners and extend the keys' expiry (a
--         runner asks on its first beat and about once a minute after)
-- ARGV[5] the highest fencing token this runner has seen ('0' none)
-- returns {Redis time in ms (runners read their clock offset from it), the
--   fleet's token floor ('0' none)}: every runner raises its own floor to
--   it, so a token one runner saw is a floor of every other's grants after
--   their next beat, and after Redis lost the key the next beat writes it
--   back
-- Both keys expire about a keep time after the last beat of any runner, so
-- a deployment with no runners left leaves nothing behind.
-- Cost per beat: TIME, HSET, ZADD, GET (and SET when this runner's floor
-- is higher); with ARGV[4] ZRANGEBYSCORE, PEXPIRE x2
-- (and HDEL, ZREM per gone runner dropped). An idle runner's beats are most
-- of what it sends Redis, so the upkeep is not paid on every one.
local now = now_ms()
rcall('HSET', KEYS[1], ARGV[1], ARGV[2])
rcall('ZADD', KEYS[2], now, ARGV[1])
if ARGV[4] == '1' then
  local old = rcall('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonum(ARGV[3])))
  for _, owner in ipairs(old) do
    rcall('HDEL', KEYS[1], owner)
    rcall('ZREM', KEYS[2], owner)
  end
  rcall('PEXPIRE', KEYS[1], ARGV[3])
  rcall('PEXPIRE', KEYS[2], ARGV[3])
end
local floor = rcall('GET', KEYS[3])
if ARGV[5] ~= '0' and ARGV[5] ~= floor and dec_ge(ARGV[5], floor) then
  rcall('SET', KEYS[3], ARGV[5], 'PX', ARGV[3])
  floor = ARGV[5]
end
return {now, floor or '0'}
