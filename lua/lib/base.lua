-- lib/base.lua: what every other part of the library builds on — the
-- standard functions bound as upvalues, Redis time, numbers formatted for
-- Redis, comma lists, and leases with their fencing tokens.
-- The files of lib/ are one chunk, in lua.libFiles' order, prepended to
-- every tasklease script (lua.Source: only the helpers a script uses) or
-- defined once in the Functions library (lua.NewLibrary). Nothing here runs
-- on its own; each helper documents what it touches, and callers pass every
-- key through KEYS (or derive it in a declared key's slot) so scripts stay
-- Redis Cluster safe.

-- The standard functions the hot path calls, as upvalues bound at the
-- start of every script call (bind: lua.Source and the Functions library
-- emit the call). In a Redis Function every global is found through the
-- globals' metatable: ~13 ns an access (redis.call is two) against ~0.5 ns
-- for an upvalue, and a run makes a few hundred. They cannot be bound when
-- the library loads: its loading environment has neither the string
-- library nor redis.call.
-- In the Functions library the upvalues outlive the call, so a call after
-- the first finds them bound and returns at once; a script run by EVAL
-- defines them afresh each time.
-- has_lmpop: Redis 7's LMPOP pops from the first non-empty of several
-- lists in one call (read_lanes); Redis 6 and the embedded Redis have none.
local rcall, ssub, sfind, sbyte, tonum, unpk, ltype, has_lmpop
local function bind()
  if rcall then return end
  rcall, ssub, sfind, sbyte, tonum, unpk, ltype = redis.call, string.sub, string.find, string.byte, tonumber, unpack, type
  has_lmpop = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
end

-- clock returns Redis time once, as decimal strings: milliseconds and
-- microseconds since the epoch. Strings, because every timestamp goes back
-- to Redis, and formatting a Lua number (a double) is costly; Lua coerces
-- them in arithmetic, comparisons need tonumber.
local function clock()
  local t = rcall('TIME')
  local us6 = t[2]
  if #us6 < 6 then us6 = string.rep('0', 6 - #us6) .. us6 end
  return t[1] .. ssub(us6, 1, 3), t[1] .. us6
end

-- now_ms returns Redis server time in milliseconds (a decimal string):
-- expiry and every timestamp come from Redis, never from a runner's clock.
local function now_ms()
  local ms = clock()
  return ms
end

-- tok_str formats a fencing token (or any integer number) for Redis: Lua's
-- tostring gives "1.7e+15" for microsecond tokens.
local function tok_str(n)
  if ltype(n) == 'string' then return n end
  return string.format('%.0f', n)
end

-- INT holds the decimal strings of small integers. A Lua number passed to
-- redis.call, or concatenated, is formatted by snprintf (~2,500
-- instructions in Redis 7.0); the counters on the hot path (attempt, done,
-- a repeat's count, an LPOP count) are small, and a lookup costs ~50.
local INT = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15', '16'}

-- int_str formats a non-negative integer (a number) for Redis.
local function int_str(n) return INT[n] or tok_str(n) end

-- NUM is INT backwards: tonumber converts a string twice (~1,200
-- instructions), and the counters a run reads (attempt, maxAttempts,
-- done, a call's entry count) are small.
local NUM = {}
for i = 0, #INT do NUM[INT[i]] = i end

-- small_num is tonumber for a string that is usually a small counter.
local function small_num(s) return NUM[s] or tonum(s) end

-- CONF holds the numbers of configuration arguments — history cap,
-- retention, reclaim idle — converted once per library load instead of on
-- every use. Only for those: a handful of distinct values a deployment,
-- where a value that changes per call would grow the table for good.
local CONF = {}

-- conf_num is tonumber for a configuration argument (CONF).
local function conf_num(s)
  local n = CONF[s]
  if n == nil and s then
    n = tonum(s)
    CONF[s] = n
  end
  return n
end

-- split splits s on sep (a single plain character); "" gives {}.
local function split(s, sep)
  local out = {}
  if s == nil or s == false or s == '' then return out end
  local start = 1
  while true do
    local i = sfind(s, sep, start, true)
    if not i then
      out[#out + 1] = ssub(s, start)
      return out
    end
    out[#out + 1] = ssub(s, start, i - 1)
    start = i + 1
  end
end

-- list_has reports whether comma list holds item.
local function list_has(list, item)
  if not list or list == '' then return false end
  if list == item then return true end
  -- most lists do not hold item even as a substring: one search, no strings made
  if not sfind(list, item, 1, true) then return false end
  return sfind(',' .. list .. ',', ',' .. item .. ',', 1, true) ~= nil
end

-- list_add appends item to a comma list unless present.
local function list_add(list, item)
  if not list or list == '' then return item end
  if list_has(list, item) then return list end
  return list .. ',' .. item
end

-- list_at returns the i-th item (1-based) of a comma list, or ''.
local function list_at(list, i)
  if not list or list == '' or i < 1 then return '' end
  local start = 1
  for _ = 2, i do -- skip i - 1 items, making no strings
    local comma = sfind(list, ',', start, true)
    if not comma then return '' end
    start = comma + 1
  end
  local comma = sfind(list, ',', start, true)
  return ssub(list, start, comma and comma - 1 or -1)
end

-- CONFS caches configuration arguments split into their fields. A runner
-- sends what is constant about it — owner, reclaim idle, history cap,
-- retention, its jobs' definitions — as one argument, its fields separated
-- by US (0x1F), instead of an argument each (~800 instructions apiece to
-- pass); the Functions library keeps the split across calls, so a call
-- after the first reads it with one lookup. Callers treat it as read only
-- (read_next keeps the job table it derives on it). Bounded: emptied at
-- CONFS_MAX values (a restarted runner has a new owner, so a new value).
local CONFS, n_confs, CONFS_MAX = {}, 0, 256

-- conf_fields is configuration argument s split on US, cached (CONFS).
local function conf_fields(s)
  local f = CONFS[s]
  if f then return f end
  f = split(s, '\31')
  if n_confs >= CONFS_MAX then CONFS, n_confs = {}, 0 end
  CONFS[s], n_confs = f, n_confs + 1
  return f
end

-- with_fields appends the field list extra (or nothing, when nil) to an
-- HSET's field list, and returns it.
local function with_fields(fields, extra)
  if extra then
    for i = 1, #extra do fields[#fields + 1] = extra[i] end
  end
  return fields
end

-- lease_value is what a lease key holds: "<token>|<owner>".
local function lease_value(token, owner)
  return tok_str(token) .. '|' .. owner
end

-- lease_held reports whether lease_key is held by owner with token.
local function lease_held(lease_key, owner, token)
  return rcall('GET', lease_key) == lease_value(token, owner)
end

-- next_token is the fencing token that follows prev: max(prev + 1, Redis
-- TIME in microseconds; now_us as clock returns it). The time floor keeps
-- tokens monotonic when Redis loses the previous token (restart without
-- persistence, failover to a lagging replica, a flush, an expired counter).
-- Tokens stay below 2^53. Returns the token as a decimal string.
local function next_token(prev, now_us)
  -- Both are decimal strings without leading zeros, so a shorter or
  -- smaller one is a smaller number: the common case (the clock is ahead)
  -- converts neither.
  if prev and #prev >= #now_us and (#prev > #now_us or prev >= now_us) then
    local p = tonum(prev)
    if p and p + 1 > tonum(now_us) then return tok_str(p + 1) end
  end
  return now_us
end

-- dec_ge reports a >= b for decimal strings without leading zeros (a may be
-- nil or '': false), without converting either.
local function dec_ge(a, b)
  if not a or a == '' then return false end
  if b == nil or b == false or b == '' then return true end
  return #a > #b or (#a == #b and a >= b)
end

-- floored is now_us (as clock returns it) raised above floor, the calling
-- runner's token floor: the highest fencing token it has seen, or its own
-- clock in µs when later (jobs/tokenfloor.go; '' or nil: none). next_token's
-- time floor alone fails when Redis lost a key's token and its clock
-- lags — a failover to a replica whose clock is behind by more than the
-- time since the key's last grant: TIME then gives a token below one
-- already issued. The runners remember what Redis forgot. Decimal strings
-- without leading zeros: the common case (the clock ahead) converts
-- neither.
local function floored(now_us, floor)
  if dec_ge(floor, now_us) then
    local f = tonum(floor)
    if f then return tok_str(f + 1) end
  end
  return now_us
end

-- lease_grant takes a free lease (SET PX) with the next fencing token,
-- counted in fence_key, which may expire (fence_ttl_ms). This is the
-- standalone lease API (package leasing); the engine keeps the counter in
-- the run record instead (claim.lua).
-- Returns token (a number), or nil, holder value, remaining ms.
local function lease_grant(lease_key, fence_key, owner, ttl_ms, fence_ttl_ms)
  local cur = rcall('GET', lease_key)
  if cur then
    return nil, cur, rcall('PTTL', lease_key)
  end
  local _, now_us = clock()
  local token = next_token(rcall('GET', fence_key), now_us)
  rcall('SET', fence_key, token, 'PX', fence_ttl_ms)
  rcall('SET', lease_key, lease_value(token, owner), 'PX', ttl_ms)
  return tonum(token)
end
