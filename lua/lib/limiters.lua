-- lib/limiters.lua: fleet-wide limiters (limiter_acquire.lua,
-- limiter_renew.lua, limiter_release.lua). A limiter's keys share one hash
-- tag, "{<prefix>:limiter:<name>}", so on Redis Cluster a limiter lives in
-- a slot of its own; every key is derived from KEYS[1], the limiter's hash:
--   <L>          hash: n (slots made), token (the last slot token), seq
--                (waiting order), waiting (count of <L>:wmeta), tat (GCRA
--                theoretical arrival, ms), holdUntil (ms)
--   <L>:slots    sorted set: slot number → expiry (ms; 0 = never used or
--                released). A slot is free when its expiry is past, so a
--                dead holder's slot frees itself.
--   <L>:holders  hash: slot number → owner US token US state US lane US
--                group US member (state 'h' held, 'r' reserved for a
--                waiter popped for owner and not yet renewed)
--   <L>:wmeta    hash: waiting member → lane US group
--   <L>:wp       sorted set: people's waiting members by arrival
--   <L>:wg:<g>   sorted set: group g's waiting members by arrival
--   <L>:groups   list: groups with waiting members, in turn order
-- A member is a request entry (the run it names is claimed after its
-- grant); the slot's number and token let a downstream fence the slot:
-- one accepted writer per slot number at any instant.
-- lim_conf fields (comma-separated, jobs.limiterDef.conf): concurrency
-- (0: none), GCRA emission interval (ms, 0: no rate), burst.


-- LIMS caches each limiter's key names and parsed configuration by hash
-- and configuration (bounded like CONFS: emptied at 256 entries).
local LIMS, n_lims = {}, 0

-- lim_open returns the limiter's state for one call: keys, configuration
-- and Redis time, raised above floor (the caller's token floor, '' none:
-- lib/base.lua floored), so slot tokens keep growing when Redis lost the
-- limiter and its clock lags; the slots are (re)made when the concurrency
-- changed.
local function lim_open(base, conf, ttl, floor)
  local id = base .. ' ' .. conf
  local k = LIMS[id]
  if not k then
    local cf = split(conf, ',')
    k = {slots = base .. ':slots', holders = base .. ':holders', wmeta = base .. ':wmeta', wp = base .. ':wp',
      groups = base .. ':groups', conc = tonum(cf[1]) or 0, interval = tonum(cf[2]) or 0, burst = tonum(cf[3]) or 1}
    if k.burst < 1 then k.burst = 1 end
    if n_lims >= 256 then LIMS, n_lims = {}, 0 end
    LIMS[id], n_lims = k, n_lims + 1
  end
  local l = {base = base, slots = k.slots, holders = k.holders, wmeta = k.wmeta, wp = k.wp, groups = k.groups,
    conc = k.conc, interval = k.interval, burst = k.burst, ttl = tonum(ttl) or 0, freed = {}}
  local ms, us = clock()
  l.now = tonum(ms)
  l.ms = ms
  l.us = floored(us, floor)
  local h = rcall('HMGET', base, 'n', 'tat', 'holdUntil', 'token', 'waiting')
  l.tat = tonum(h[2]) or 0
  l.hold = tonum(h[3]) or 0
  l.token = h[4] or nil
  l.waiting = tonum(h[5]) or 0
  local made = tonum(h[1]) or 0
  if made ~= l.conc then
    for i = 0, l.conc - 1 do rcall('ZADD', l.slots, 'NX', 0, i) end
    -- Slots beyond a lowered concurrency go when free; held ones when
    -- released (lim_free).
    for i = l.conc, made - 1 do
      local s = tonum(rcall('ZSCORE', l.slots, i))
      if s and s <= l.now then
        rcall('ZREM', l.slots, i)
        rcall('HDEL', l.holders, i)
      end
    end
    rcall('HSET', base, 'n', l.conc)
  end
  return l
end

-- lim_holder returns slot i's holder fields {owner, token, state, lane,
-- group, member}, or nil.
local function lim_holder(l, i)
  local v = rcall('HGET', l.holders, i)
  if not v then return nil end
  local f = {}
  local from = 1
  for k = 1, 5 do
    local at = sfind(v, US, from, true)
    f[k] = ssub(v, from, at - 1)
    from = at + 1
  end
  f[6] = ssub(v, from)
  return f
end

-- lim_wait adds member to the waiting members (NX: a member waiting keeps
-- its place); front puts it first in its queue (a reservation that
-- expired unclaimed).
local function lim_wait(l, member, lane, group, front)
  if rcall('HSETNX', l.wmeta, member, lane .. US .. group) == 0 then return end
  l.waiting = l.waiting + 1
  rcall('HSET', l.base, 'waiting', l.waiting)
  local score = 0
  if not front then score = rcall('HINCRBY', l.base, 'seq', 1) end
  if lane == 'p' then
    rcall('ZADD', l.wp, score, member)
  else
    local q = l.base .. ':wg:' .. group
    rcall('ZADD', q, score, member)
    if rcall('ZCARD', q) == 1 then rcall('RPUSH', l.groups, group) end
  end
end

-- lim_free_slot returns a free slot's number (its expiry past), or nil
-- and the earliest expiry. A reservation found expired puts its waiter
-- back first in line.
local function lim_free_slot(l)
  if l.conc == 0 then return -1 end
  local n = #l.freed
  if n > 0 and tonum(l.freed[n]) < l.conc then -- given back in this call (lim_release): not written free yet
    local i = l.freed[n]
    l.freed[n] = nil
    return i
  end
  local s = rcall('ZRANGE', l.slots, 0, 0, 'WITHSCORES')
  if #s == 0 then return nil, l.now + 1000 end
  local i, exp = s[1], tonum(s[2])
  if exp > l.now then return nil, exp end
  if tonum(i) >= l.conc then -- left from a higher concurrency: gone now that it is free
    rcall('ZREM', l.slots, i)
    rcall('HDEL', l.holders, i)
    return lim_free_slot(l)
  end
  if exp > 0 then
    local h = lim_holder(l, i)
    if h and h[3] == 'r' then lim_wait(l, h[6], h[4], h[5], true) end
    rcall('HDEL', l.holders, i)
  end
  return i
end

-- lim_rate_next returns 0 when the rate admits a start now, else when it
-- will (GCRA: at most burst at once, one per interval after).
local function lim_rate_next(l)
  if l.interval == 0 then return 0 end
  local at = l.tat - (l.burst - 1) * l.interval
  if at <= l.now then return 0 end
  return at
end

-- lim_reason returns nil when a start would be admitted now, else why not
-- and when to look again; unlike lim_blocked it changes nothing.
local function lim_reason(l)
  if l.hold > l.now then return 'held', l.hold end
  local at = lim_rate_next(l)
  if at > 0 then return 'rate', at end
  if l.conc == 0 or #l.freed > 0 then return nil end
  local s = rcall('ZRANGE', l.slots, 0, 0, 'WITHSCORES')
  if #s > 0 and tonum(s[2]) > l.now then return 'full', tonum(s[2]) end
  return nil
end

-- lim_blocked returns nil when a start is admitted now (and the free
-- slot's number, -1 without concurrency, which the caller must take:
-- a slot given back in this call is handed out only once), else a reason
-- and when to look again.
local function lim_blocked(l)
  if l.hold > l.now then return nil, 'held', l.hold end
  local at = lim_rate_next(l)
  if at > 0 then return nil, 'rate', at end
  local i, exp = lim_free_slot(l)
  if not i then return nil, 'full', exp end
  return i
end

-- lim_take gives slot i to member for owner, charges the rate and returns
-- the slot's new fencing token (the counter and the rate's time in one
-- HSET: the script reads and writes them atomically). Tokens are taken as
-- the leases' are (next_token: at least Redis time in µs), so they keep
-- growing when Redis loses the limiter's hash: a downstream fencing by
-- slot never sees one go back.
local function lim_take(l, i, member, owner, state, lane, group)
  local token = next_token(l.token, l.us)
  l.token = token
  if l.interval > 0 then
    l.tat = math.max(l.tat, l.now) + l.interval
    rcall('HSET', l.base, 'token', token, 'tat', string.format('%.3f', l.tat))
  else
    rcall('HSET', l.base, 'token', token)
  end
  if tonum(i) >= 0 then
    rcall('ZADD', l.slots, l.now + l.ttl, i)
    rcall('HSET', l.holders, i, owner .. US .. token .. US .. state .. US .. lane .. US .. group .. US .. member)
  end
  return token
end

-- lim_pop removes the best waiting member — people first, then the groups
-- in turn, oldest first within one — and returns it with its lane and
-- group, or nil.
local function lim_popped(l, member)
  rcall('HDEL', l.wmeta, member)
  l.waiting = l.waiting - 1
  rcall('HSET', l.base, 'waiting', l.waiting)
end

local function lim_pop(l)
  local p = rcall('ZPOPMIN', l.wp)
  if #p > 0 then
    lim_popped(l, p[1])
    return p[1], 'p', ''
  end
  while true do
    local g = rcall('LPOP', l.groups)
    if not g then return nil end
    local q = l.base .. ':wg:' .. g
    local m = rcall('ZPOPMIN', q)
    if #m > 0 then
      if rcall('ZCARD', q) > 0 then rcall('RPUSH', l.groups, g) end
      lim_popped(l, m[1])
      return m[1], 'b', g
    end
  end
end

-- lim_unreserve puts back first in line the waiters of reservations that
-- expired unclaimed (their runner died, or never read the reply that
-- reserved them): lim_free_slot finds one only once every slot scored
-- lower is taken, and a pump with nobody waiting would not look at all.
-- Their slots are written free. Cost: ZRANGEBYSCORE, and per expired
-- slot an HGET (a reservation: HDEL, ZADD and lim_wait's writes).
local function lim_unreserve(l)
  if l.conc == 0 then return end
  local exp = rcall('ZRANGEBYSCORE', l.slots, '(0', l.now)
  for k = 1, #exp do
    local h = lim_holder(l, exp[k])
    if h and h[3] == 'r' then
      lim_wait(l, h[6], h[4], h[5], true)
      rcall('HDEL', l.holders, exp[k])
      rcall('ZADD', l.slots, 0, exp[k])
    end
  end
end

-- lim_pump reserves free slots for up to n waiting members, for owner,
-- appending {member, slot, token} to out; returns when to look again
-- (0: nothing waits) and how many still wait.
local function lim_pump(l, owner, n, out)
  if l.waiting <= 0 and n > 0 then lim_unreserve(l) end
  while true do
    if l.waiting <= 0 then return 0, 0 end
    if n <= 0 then
      local why, at = lim_reason(l)
      if why then return at, l.waiting end
      return l.now, l.waiting
    end
    local i, _, at = lim_blocked(l)
    if not i then return at, l.waiting end
    local m, lane, group = lim_pop(l)
    if not m then -- the count was off (a flushed set): it is what is left
      if tonum(i) >= 0 then l.freed[#l.freed + 1] = i end -- untaken: lim_close writes it free
      l.waiting = rcall('HLEN', l.wmeta)
      rcall('HSET', l.base, 'waiting', l.waiting)
      return 0, l.waiting
    end
    out[#out + 1] = {m, tonum(i), lim_take(l, i, m, owner, 'r', lane, group)}
    n = n - 1
  end
end

-- lim_slot_of returns slot i's holder fields when member holds it for
-- owner with token (state 'h' or 'r'). Its expiry is not asked: a slot
-- that expired is only ever taken by overwriting its holder (lim_take), so
-- while the holder is unchanged nobody else executed under it, and
-- renewing or releasing it is safe.
local function lim_slot_of(l, i, member, owner, token)
  local h = lim_holder(l, i)
  if not h or h[6] ~= member or h[1] ~= owner or h[2] ~= token then return nil end
  return h
end

-- lim_in returns how long from now (ms, by Redis time, as a string) until
-- at; 0 for no time (at 0).
local function lim_in(l, at)
  if at == 0 then return '0' end
  return tostring(math.max(math.floor(at - l.now), 0))
end

-- lim_hold holds the limiter's starts until now + ms (holdOnRetryAfter).
local function lim_hold(l, ms)
  if ms > 0 and l.now + ms > l.hold then
    l.hold = l.now + ms
    rcall('HSET', l.base, 'holdUntil', l.hold)
  end
end

-- lim_release frees slot i (-1: a rate-only limiter) when member holds it
-- for owner with token (its holder starts "owner US token US" and ends
-- "US member": lim_take); refund gives back the rate charged for a start
-- that never ran. The slot is only marked free in l.freed: a start in the
-- same call takes it over with one write (lim_take), and lim_close writes
-- the rest free. With again (the group of member, or nil) member waits
-- again, first in line: a reserved run whose claim's outcome is unknown
-- keeps its place instead of waiting for its entry's recheck.
local function lim_release(l, i, token, member, owner, refund, again)
  if tonum(i) >= 0 then
    local v = rcall('HGET', l.holders, i)
    local pre, suf = owner .. US .. token .. US, US .. member
    if v and ssub(v, 1, #pre) == pre and ssub(v, -#suf) == suf then l.freed[#l.freed + 1] = i end
  end
  if again then lim_wait(l, member, ssub(member, 1, 1), again, true) end
  if refund and l.interval > 0 then
    l.tat = l.tat - l.interval
    rcall('HSET', l.base, 'tat', string.format('%.3f', l.tat))
  end
end

-- lim_close writes free the slots given back in this call and not taken
-- over (lim_release).
local function lim_close(l)
  local freed = l.freed
  for j = 1, #freed do
    rcall('ZADD', l.slots, 0, freed[j])
    rcall('HDEL', l.holders, freed[j])
  end
  l.freed = {}
end
