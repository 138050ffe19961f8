-- lib/history.lua: a key's history (a capped list of compact events) and
-- the coalescing of repeated requests into counts on their first event.

-- History is a capped list of compact events, oldest first. An event is
-- one string, its fields joined by US (0x1F): at, event, runId, source,
-- stage, outcome, owner, fencingToken, error — and, once a coalesced
-- repeat has been folded in, count and lastAt (jobs/history.go parses it).
-- A list entry costs a few dozen bytes where a stream entry cost hundreds.
local US = '\31'

-- hist_ev encodes one event without an error from its fields (nil or false
-- reads as empty); token is a string or a number. Positional, not a table:
-- a table per event cost more than the concatenation.
local function hist_ev(now, event, run_id, source, stage, outcome, owner, token)
  if token and ltype(token) ~= 'string' then token = tok_str(token) end
  return now .. US .. event .. US .. (run_id or '') .. US .. (source or '') .. US .. (stage or '') .. US ..
    (outcome or '') .. US .. (owner or '') .. US .. (token or '') .. US
end

-- hist_err encodes an event of a run's stage that carries an error text
-- (US, the field separator, is replaced in it); err '' gives hist_ev's.
-- (Not `err = (string.gsub(err, …))`: gopher-lua, miniredis's Lua, passes
-- gsub itself as the argument when a local is assigned a parenthesised
-- call on itself.)
local function hist_err(now, event, run_id, stage, outcome, owner, token, err)
  local ev = hist_ev(now, event, run_id, '', stage, outcome, owner, token)
  if not err or err == '' then return ev end
  return ev .. (string.gsub(err, US, ' '))
end

-- hist_push appends encoded events and trims the list to cap; the trim
-- costs a call only once the list is full.
local function hist_push(hist, cap, ...)
  local n = rcall('RPUSH', hist, ...)
  if n > conf_num(cap) then rcall('LTRIM', hist, '-' .. cap, '-1') end
end

-- hist_push_after appends event ev, after event before when there is one
-- (a completed stage's event goes in the same RPUSH as the result's).
local function hist_push_after(hist, cap, before, ev)
  if before then hist_push(hist, cap, before, ev) else hist_push(hist, cap, ev) end
end

-- Coalesced requests (docs/policies.md): of the requests that leave a run as it
-- is (joined, skipped, queued, throttled), the first per (source,
-- outcome) of a run appends an event; repeats only count. The record
-- field co_field(source, outcome) holds "<runId> <event>", the event
-- exactly as appended, and n_field(...) "<count> <lastAt>" once it was
-- repeated; field 'co' lists the co fields. Readers add count and lastAt to
-- the matching event; co_fold writes them into the list before the record
-- moves on to another run. A repeat costs one HSET of a short field.
local function co_field(source, outcome) return 'c:' .. source .. ':' .. outcome end
local function n_field(source, outcome) return 'n:' .. source .. ':' .. outcome end

-- co_of_run reports whether co value v belongs to run run_id (without
-- making strings: this is on every repeated request's path).
local function co_of_run(v, run_id)
  return v and run_id and sbyte(v, #run_id + 1) == 32 and sfind(v, run_id, 1, true) == 1
end

-- DIGIT_AFTER: the digit after digit byte b ('0'..'8'), for repeat_count.
local DIGIT_AFTER = {[48] = '1', [49] = '2', [50] = '3', [51] = '4', [52] = '5', [53] = '6', [54] = '7', [55] = '8',
  [56] = '9'}

-- repeat_count is the n_field value after one more repeat. The count is
-- incremented as a decimal string when its last digit does not carry: a
-- hot key's counts soon leave INT's range, where tonumber and
-- string.format cost ~3,500 instructions together and bumping the last
-- digit ~1,500.
local function repeat_count(n_value, now)
  local sp = n_value and sfind(n_value, ' ', 1, true)
  if not sp then return '2 ' .. now end -- the first repeat (the first request counts 1)
  local next_digit = sp > 1 and DIGIT_AFTER[sbyte(n_value, sp - 1)]
  if next_digit then return ssub(n_value, 1, sp - 2) .. next_digit .. ' ' .. now end
  return int_str((small_num(ssub(n_value, 1, sp - 1)) or 1) + 1) .. ' ' .. now
end

-- hist_request records a request that leaves run run_id as it is. c, n
-- are the record's co_field and n_field values for (source, outcome).
-- Appends an event only for the first of its kind in the run. Returns the
-- field and value to write (the caller merges them into its HSET) and
-- whether the co field is new (the caller adds it to 'co').
local function hist_request(hist, cap, now, event, run_id, source, outcome, c, n)
  if co_of_run(c, run_id) then
    return n_field(source, outcome), repeat_count(n, now), false
  end
  local ev = hist_ev(now, event, run_id, source, '', outcome)
  hist_push(hist, cap, ev)
  return co_field(source, outcome), run_id .. ' ' .. ev, true
end

-- co_fold writes the counts of the record's coalesced requests into their
-- history events (when an event was repeated) and deletes the fields; with
-- outcome, only those of that outcome (the rest stay listed in 'co').
local function co_fold(task, hist, co_list, outcome)
  if not co_list or co_list == '' then return end
  local fields = split(co_list, ',')
  local rest = nil
  if outcome then
    local sel, suffix = {}, ':' .. outcome
    rest = {}
    for i = 1, #fields do
      local f = fields[i]
      if ssub(f, -#suffix) == suffix then sel[#sel + 1] = f else rest[#rest + 1] = f end
    end
    if #sel == 0 then return end
    fields = sel
  end
  local all = {}
  for i = 1, #fields do
    all[i] = fields[i]
    all[#fields + i] = 'n' .. ssub(fields[i], 2)
  end
  local vals = rcall('HMGET', task, unpk(all))
  for i = 1, #fields do
    local c, n = vals[i], vals[#fields + i]
    if c and n then
      local ev = string.match(c, '^%S* (.*)$')
      local count, last = string.match(n, '^(%d+) (%d+)$')
      if ev and count then
        local idx = rcall('LPOS', hist, ev)
        if idx then rcall('LSET', hist, idx, ev .. US .. count .. US .. last) end
      end
    end
  end
  if rest and #rest > 0 then
    rcall('HDEL', task, unpk(all))
    rcall('HSET', task, 'co', table.concat(rest, ','))
  else
    rcall('HDEL', task, 'co', unpk(all))
  end
end
