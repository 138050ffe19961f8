-- lib.lua: helpers prepended to every tasklease script (see lua.go).
-- Nothing here runs on its own; each function documents what it touches, and
-- callers pass every key through KEYS so scripts stay Redis Cluster safe.

-- The standard functions the hot path calls, as upvalues bound at the
-- start of every script call (bind: lua.Source and the Functions library
-- emit the call). In a Redis Function every global is found through the
-- globals' metatable: ~13 ns an access (redis.call is two) against ~0.5 ns
-- for an upvalue, and a run makes a few hundred. They cannot be bound when
-- the library loads: its loading environment has neither the string
-- library nor redis.call.
-- has_lmpop: Redis 7's LMPOP pops from the first non-empty of several
-- lists in one call (read_lanes); Redis 6 and the embedded Redis have none.
local rcall, ssub, sfind, tonum, unpk, has_lmpop
local function bind()
  rcall, ssub, sfind, tonum, unpk = redis.call, string.sub, string.find, tonumber, unpack
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
  if type(n) == 'string' then return n end
  return string.format('%.0f', n)
end

-- INT holds the decimal strings of small integers. A Lua number passed to
-- redis.call, or concatenated, is formatted by snprintf (~2,500
-- instructions in Redis 7.0); the counters on the hot path (attempt, done,
-- a repeat's count, an LPOP count) are small, and a lookup costs ~50.
local INT = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15', '16'}

-- int_str formats a non-negative integer (a number) for Redis.
local function int_str(n) return INT[n] or tok_str(n) end

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
  local p = tonum(prev)
  if p and p + 1 > tonum(now_us) then return tok_str(p + 1) end
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
  if token and type(token) ~= 'string' then token = tok_str(token) end
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
  local c = tonum(cap)
  if n > c then rcall('LTRIM', hist, -c, -1) end
end

-- hist_push_after appends event ev, after event before when there is one
-- (a completed stage's event goes in the same RPUSH as the result's).
local function hist_push_after(hist, cap, before, ev)
  if before then hist_push(hist, cap, before, ev) else hist_push(hist, cap, ev) end
end

-- with_fields appends the field list extra (or nothing, when nil) to an
-- HSET's field list, and returns it.
local function with_fields(fields, extra)
  if extra then
    for i = 1, #extra do fields[#fields + 1] = extra[i] end
  end
  return fields
end

-- Coalesced requests (DESIGN §3): of the requests that leave a run as it
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
  return v and run_id and string.byte(v, #run_id + 1) == 32 and sfind(v, run_id, 1, true) == 1
end

-- repeat_count is the n_field value after one more repeat.
local function repeat_count(n_value, now)
  local count = n_value and tonum(string.match(n_value, '^%d+')) or 1
  return int_str(count + 1) .. ' ' .. now
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
-- history events (when an event was repeated) and deletes the fields.
local function co_fold(task, hist, co_list)
  if not co_list or co_list == '' then return end
  local fields = split(co_list, ',')
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
  rcall('HDEL', task, 'co', unpk(all))
end

-- PUBLISH_CMD publishes views and cancels: PUBLISH, or SPUBLISH (sharded
-- pub/sub: a message goes only to the shard of its channel's slot) in the
-- Functions library built for Redis Cluster (lua.NewLibrary).
local PUBLISH_CMD = 'PUBLISH'

-- publish_view publishes the task record (minus the binary cursor) as JSON
-- on the partition's channel; subscribers turn it into a TaskView. It is
-- skipped while watch_key is absent: subscribers (Registry.Subscribe) keep
-- that key alive, and encoding views nobody reads costs a third of a
-- script's time. watch_key nil: the caller checked it (publish).
local function publish_view(task_key, channel, watch_key)
  if watch_key and rcall('EXISTS', watch_key) == 0 then return end
  local flat = rcall('HGETALL', task_key)
  local view = {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    local pre = ssub(f, 1, 2)
    if f ~= 'cursor' and f ~= 'co' and pre ~= 'c:' and pre ~= 'n:' then view[f] = flat[i + 1] end
  end
  rcall(PUBLISH_CMD, channel, cjson.encode(view))
end

-- publish publishes task_key's view (publish_view) for one script call
-- through w, a table the caller keeps for the call — w.events (channel),
-- w.watch (watch key) and w.watched (whether the watch key exists: nil
-- until asked, false or true after) — so the watch key's EXISTS is asked
-- once however many records the call publishes (it cannot change within
-- the call). The fields live in a table the caller has anyway (a claim's
-- c, a submit's partition), not in a closure: a closure per call costs
-- about as much as the EXISTS it saves.
local function publish(w, task_key)
  local watched = w.watched
  if watched == nil then
    watched = rcall('EXISTS', w.watch) == 1
    w.watched = watched
  end
  if watched then publish_view(task_key, w.events, nil) end
end

-- fenced reports whether the caller may write the run record: it holds the
-- lease with this token, and the record is still this run's, at this token.
local function fenced(lease_key, task_key, owner, token, run_id)
  if not lease_held(lease_key, owner, token) then return false end
  local rec = rcall('HMGET', task_key, 'runId', 'token')
  return rec[1] == run_id and rec[2] == tok_str(token)
end

-- cp_begin hands the run record of task_key to a new lease holder (the
-- standalone checkpoint API, checkpoint_begin.lua; the engine's claim.lua
-- does the same inline). A record of another run starts a fresh checkpoint;
-- the same run keeps its completed stages and cursor (recovery resumes).
-- Returns done, stage, cursor, attempt.
local function cp_begin(task_key, run_id, stages_csv, owner, token, now)
  local rec = rcall('HMGET', task_key, 'runId', 'done', 'cursor', 'stages', 'startedAt', 'status', 'finishedAt')
  local done, cursor, stages_now
  if rec[1] ~= run_id then
    done, cursor, stages_now = 0, '', stages_csv
    local f = {'runId', run_id, 'stages', stages_csv, 'done', '0', 'cursor', '',
      'attempt', '0', 'startedAt', now, 'finishedAt', '', 'lastError', '', 'cancel', '0', 'v', ''}
    -- an engine run that ended done keeps its time in finishedAt alone
    -- (finish_terminal): moved to lastSuccessAt, as new_run does
    if rec[6] == 'done' and rec[7] and rec[7] ~= '' then f[#f + 1], f[#f + 2] = 'lastSuccessAt', rec[7] end
    rcall('HSET', task_key, unpk(f))
  else
    done, cursor, stages_now = tonum(rec[2]) or 0, rec[3] or '', rec[4] or stages_csv
    if not rec[5] or rec[5] == '' then rcall('HSET', task_key, 'startedAt', now, 'v', '') end
  end
  local stages = split(stages_now, ',')
  local stage = stages[done + 1] or ''
  local attempt = rcall('HINCRBY', task_key, 'attempt', 1)
  rcall('HSET', task_key, 'status', 'running', 'stage', stage, 'owner', owner,
    'token', tok_str(token), 'updatedAt', now, 'nextAttemptAt', '', 'waiting', '', 'v', '')
  return done, stage, cursor, attempt
end

-- Request queues. Each partition has two lanes, lists of entries: people's
-- requests (manual, foreground) go to the people lane, which runners read
-- first; bulk work (schedule, retry) to the bulk lane. A record's 'lane' is
-- 'p' or 'b' (absent: bulk). A runner takes entries off a lane into the
-- partition's taken set (a sorted set scored by when each becomes
-- reclaimable: a holder's heartbeat moves it on), and the script that ends
-- the entry's attempt removes it from there. Every move of an entry happens
-- inside one script, so an entry is always in a lane or in the taken set
-- until it is acknowledged. The bell is a list holding at most one token,
-- rung when a lane gets work: idle runners block on it (BLPOP) instead of on
-- the lanes, which would take an entry outside a script.
-- An entry is "<lane><runId>US<task key>US<source>": it names the run it
-- asks for; the claim decides by the record, so a duplicate is harmless.
-- q = {b = bulk list, p = people list, bell = key, taken = key}, built by
-- queue_at from the four keys from keys[i] on, in that order
-- (keyspace.QueueKeys). (keys is the script's KEYS: a Redis Function's
-- helpers cannot see it.)
local function queue_at(keys, i)
  return {b = keys[i], p = keys[i + 1], bell = keys[i + 2], taken = keys[i + 3]}
end

-- tag_of is the partition hash tag a key starts with ("{<prefix>:p<n>}",
-- keyspace.Space.Tag). A script that declares only a run's keys derives its
-- partition's keys from it with queue_of and the names keyspace.New gives
-- them (TestLuaDerivesKeyspaceNames, lua/keys_test.go, pins them): in the slot of the
-- declared keys, so Redis Cluster routes and allows them, and each name
-- derived costs a concatenation instead of an argument parsed and copied.
local function tag_of(key) return ssub(key, 1, (sfind(key, '}', 1, true))) end

-- queue_of is queue_at's table from a partition's hash tag.
local function queue_of(tag)
  return {b = tag .. ':q:b', p = tag .. ':q:p', bell = tag .. ':bell', taken = tag .. ':taken'}
end

-- ring wakes one idle runner of the partition (one token at most).
local function ring(q)
  if rcall('LLEN', q.bell) == 0 then rcall('RPUSH', q.bell, '1') end
end

-- enqueue appends a run's entry to its lane; returns the entry.
local function enqueue(q, lane, run_id, key, source)
  local e = lane .. run_id .. US .. key .. US .. source
  if rcall('RPUSH', q[lane], e) == 1 then ring(q) end
  return e
end

-- ack_entry removes a taken entry for good (an entry still in its lane is
-- acknowledged by the claim that reads it: its run is over by then).
local function ack_entry(q, entry)
  if entry and entry ~= '' then rcall('ZREM', q.taken, entry) end
end

local function is_person(source) return source == 'manual' or source == 'foreground' end

-- lane_for picks the lane of a run requested by a comma list of sources.
local function lane_for(sources)
  if list_has(sources, 'manual') or list_has(sources, 'foreground') then return 'p' end
  return 'b'
end

-- new_run creates a queued run on record task and appends its request to
-- the partition's list of its lane, in the same script: a run record never
-- exists without its request, nor a request without its record (no
-- orphans). A record that exists keeps 'token', the key's fencing counter,
-- and folds its coalesced requests (co, its 'co' field) into the history
-- first; a new record writes only the fields that are not empty or
-- implied. q: the partition's queue keys; key: the task key; sources: the
-- run's sources (comma list), source: the first; last_success: the ending
-- run's finishedAt when it was done, else nil. Positional, not a table: a
-- table per new run cost ~2,500 instructions.
local function new_run(task, q, hist, key, run_id, stages, max_attempts, sources, source, now, exists, co, last_success)
  local lane = lane_for(sources)
  local id = enqueue(q, lane, run_id, key, source)
  if exists then
    co_fold(task, hist, co)
    local f = {'runId', run_id, 'status', 'queued', 'stages', stages, 'done', '0',
      'stage', '', 'cursor', '', 'attempt', '0', 'maxAttempts', max_attempts, 'sources', sources,
      'owner', '', 'requestedAt', now, 'startedAt', '', 'updatedAt', now, 'finishedAt', '',
      'nextAttemptAt', '', 'lastError', '', 'cancel', '0', 'followUp', '0', 'followUpSources', '',
      'entry', id, 'lane', lane, 'waiting', '', 'v', ''}
    -- finishedAt is cleared, so a done run's time (last_success) moves to
    -- lastSuccessAt: finish_terminal writes it to finishedAt alone
    if last_success then f[#f + 1], f[#f + 2] = 'lastSuccessAt', last_success end
    rcall('HSET', task, unpk(f))
    rcall('PERSIST', task)
    rcall('PERSIST', hist)
  else
    -- absent fields read as empty: done and attempt as 0, lane as bulk;
    -- subject and scope are the key's parts
    if lane == 'p' then
      rcall('HSET', task, 'key', key, 'runId', run_id, 'status', 'queued', 'stages', stages,
        'maxAttempts', max_attempts, 'sources', sources, 'requestedAt', now, 'entry', id, 'lane', lane)
    else
      rcall('HSET', task, 'key', key, 'runId', run_id, 'status', 'queued', 'stages', stages,
        'maxAttempts', max_attempts, 'sources', sources, 'requestedAt', now, 'entry', id)
    end
  end
  return id
end

-- follow_up_id is the run id of the follow-up of run run_id when the caller
-- sent none: a run ends once, so it is as unique as a random one, and
-- callers need not send an id for this rare case.
local function follow_up_id(run_id)
  return ssub(redis.sha1hex('follow-up of ' .. run_id), 1, 24)
end

-- FT_FIELDS are the record fields finish_terminal reads when its caller
-- passes no record (ft_read).
local FT_FIELDS = {'entry', 'runId', 'key', 'followUp', 'followUpSources', 'stages', 'maxAttempts',
  'stage', 'owner', 'token', 'lane', 'co', 'cancel', 'nextAttemptAt', 'waiting', 'lastError', 'v'}

-- ft_read reads fields (a list of names) of task into table r, by name:
-- r[name] is the value, or nil when the field is absent.
local function ft_read(task, fields, r)
  r = r or {}
  local vals = rcall('HMGET', task, unpk(fields))
  for i = 1, #fields do
    if vals[i] then r[fields[i]] = vals[i] end
  end
  return r
end

-- FT_FOLLOW_UP: the fields only the start of a queued follow-up reads.
local FT_FOLLOW_UP = {'followUpSources', 'co', 'maxAttempts'}

-- CLAIM_READ: the record fields claim.lua reads for each entry, in the
-- order of its rec[] indices (a retry's due time and a crashed holder's
-- owner are read only then).
local CLAIM_READ = {'runId', 'status', 'cancel', 'attempt', 'maxAttempts', 'token', 'sources', 'stages', 'done',
  'waiting', 'cursor', 'startedAt', 'v'}

-- finish_terminal ends the current run as done, failed or cancelled: it
-- acknowledges its request, records the result, and starts the queued
-- follow-up if there is one; otherwise record and history expire after the
-- retention. A follow-up is a new run: it takes the job's current
-- definition (c.stages, c.max_attempts, from the caller's registry), not the
-- ended run's; c.stages '' (a caller that does not define the job) keeps the
-- ended run's. The caller has already released (or never held) the lease.
-- r: the record by field name, holding FT_FIELDS, or nil to read them; with
-- r.partial those of FT_FOLLOW_UP are left out (read here when a follow-up
-- starts).
-- A field the caller knows to be empty may be left out (a holder's finish:
-- nextAttemptAt and waiting are cleared by the claim).
-- before: an encoded event appended just before the result's (or nil).
-- The task index is not re-scored: it is scored by a key's last request
-- (submit_one), which is what the console pre-selects by; the janitor
-- re-scores a candidate whose record still exists, so an entry leaves at
-- most two retentions after its request.
-- c: {task, q, hist, cap, retention, next_run_id (the follow-up's id:
--     '' starts none, nil derives one with follow_up_id),
--     stages, max_attempts, now, extra (more record fields to write, or nil),
--     links_from and links_to (or nil): the trace links of the requests
--     queued behind the run become the follow-up's (a new run: nothing
--     else can have written its links yet)}
local function finish_terminal(c, result, err, r, before)
  r = r or ft_read(c.task, FT_FIELDS)
  ack_entry(c.q, r.entry)
  err = err or ''
  -- finishedAt is also the record's updatedAt (jobs.viewFromValues) and,
  -- for a done run, its last success (submit_one): one field, not three.
  -- The entry is left as it is: nothing reads a finished run's entry.
  local fields = {'status', result, 'finishedAt', c.now}
  local n = 4
  -- fields the run set that a finished record shows empty
  local v = r.stage
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'stage', '', n + 2 end
  v = r.cancel
  if v and v ~= '0' then fields[n + 1], fields[n + 2], n = 'cancel', '0', n + 2 end
  v = r.nextAttemptAt
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'nextAttemptAt', '', n + 2 end
  v = r.waiting
  if v and v ~= '' then fields[n + 1], fields[n + 2], n = 'waiting', '', n + 2 end
  if err ~= '' or (r.lastError and r.lastError ~= '') then
    fields[n + 1], fields[n + 2], n = 'lastError', err, n + 2
  end
  if c.extra then
    for i = 1, #c.extra do fields[n + i] = c.extra[i] end
    n = n + #c.extra
  end
  if r.v and r.v ~= '' then fields[n + 1], fields[n + 2] = 'v', '' end -- the cached view (submit_fast)
  rcall('HSET', c.task, unpk(fields))
  hist_push_after(c.hist, c.cap, before, hist_err(c.now, result, r.runId, r.stage, '', r.owner, r.token, err))
  if r.followUp == '1' and c.next_run_id ~= '' then
    local next_run_id = c.next_run_id or follow_up_id(r.runId)
    if r.partial then ft_read(c.task, FT_FOLLOW_UP, r) end
    local srcs = r.followUpSources
    local first = list_at(srcs, 1)
    if first == '' then first = 'manual' end
    local stages, max_attempts = r.stages, r.maxAttempts
    if c.stages and c.stages ~= '' then stages, max_attempts = c.stages, c.max_attempts end
    new_run(c.task, c.q, c.hist, r.key, next_run_id, stages, max_attempts, srcs, first, c.now, true, r.co,
      result == 'done' and c.now or nil)
    hist_push(c.hist, c.cap, hist_ev(c.now, 'requested', next_run_id, first, '', 'started'))
    if c.links_from and rcall('EXISTS', c.links_from) == 1 then rcall('RENAME', c.links_from, c.links_to) end
  elseif tonum(c.retention) > 0 then
    rcall('PEXPIRE', c.task, c.retention)
    rcall('PEXPIRE', c.hist, c.retention)
  end
end

-- cancel_payload is what the cancel channel carries: "<task key> <runId>",
-- so a late message never stops a newer run of the key.
local function cancel_payload(key, run_id)
  return key .. ' ' .. run_id
end

-- POLICY_OUTCOME: the outcome of a request on an active run, by policy,
-- for the policies whose repeats are coalesced.
local POLICY_OUTCOME = {join = 'joined', skip = 'skipped', queue = 'queued'}

-- VIEW_FIELDS are the record fields a TaskView shows, in the order of
-- jobs.viewFields (submit.lua replies with them instead of the whole
-- record).
local VIEW_FIELDS = {'runId', 'status', 'stage', 'stages', 'done', 'attempt', 'maxAttempts', 'sources',
  'owner', 'token', 'requestedAt', 'startedAt', 'updatedAt', 'finishedAt', 'nextAttemptAt', 'lastError',
  'cancel', 'followUp', 'waiting'}

-- SUBMIT_READ: the record fields submit_one reads in its one HMGET: the
-- view it replies with (VIEW_FIELDS, first, so a reply can be cut from the
-- HMGET), then what it decides on.
local SUBMIT_READ = {'runId', 'status', 'stage', 'stages', 'done', 'attempt', 'maxAttempts', 'sources',
  'owner', 'token', 'requestedAt', 'startedAt', 'updatedAt', 'finishedAt', 'nextAttemptAt', 'lastError',
  'cancel', 'followUp', 'waiting', 'lastSuccessAt', 'followUpSources', 'lane', 'entry', 'co'}

-- view_reply encodes the view fields as one string, US-separated in
-- VIEW_FIELDS order (jobs.viewFromReply): one reply value instead of a
-- list. r is a record table by field name, or nil with vals, an HMGET
-- holding VIEW_FIELDS' values from index off + 1.
local function view_reply(r, vals, off)
  local out = {}
  for i = 1, #VIEW_FIELDS do
    if r then out[i] = r[VIEW_FIELDS[i]] or '' else out[i] = vals[off + i] or '' end
  end
  return table.concat(out, US)
end

-- submit_read reads what submit_one decides on (one HMGET): the coalescing
-- counters of this request's outcomes and its occurrence field (indices
-- 1..5), then SUBMIT_READ (from index 6).
local function submit_read(task, src, policy, occ_field)
  -- a new key (the common case of a fan-out or a first request): nothing to read
  if rcall('EXISTS', task) == 0 then return {} end
  local po = POLICY_OUTCOME[policy] or 'replaced'
  return rcall('HMGET', task, co_field(src, po), n_field(src, po), co_field(src, 'throttled'),
    n_field(src, 'throttled'), occ_field ~= '' and occ_field or 'runId', unpk(SUBMIT_READ))
end

-- The record caches its encoded view (view_reply) in field 'v', so that a
-- request that changes nothing reads a few fields instead of every view
-- field (on a record of ~20 fields an HMGET of all of them costs more than
-- the rest of the request). Every script that writes a view field also
-- clears 'v' in the same HSET when it holds a view (a script that read
-- it; the others write 'v' = '' unread). The cache is used only while its stamp
-- (V_TAG, runId, status, updatedAt) still matches the record — every write
-- of a view field, in this version and before it, changes the status or
-- sets updatedAt (a claim's first attempt and a finish write startedAt and
-- finishedAt instead, and change the status) —, so a writer that does not
-- clear it (an older version during a rolling deploy) cannot make it answer
-- with a stale run, status or stage.
local V_TAG = 'v2' -- bump when VIEW_FIELDS or the stamp change (jobs.TestViewCacheTag pins it)

-- LINKS_MAX bounds a run's trace links (jobs.linksMax).
local LINKS_MAX = 32

-- FAST_READ: after the co and n fields of the request's outcome.
local FAST_READ = {'status', 'runId', 'updatedAt', 'v'}

-- view_stamp is the prefix of a valid cached view for fast-read values f,
-- ending in RS (0x1E, which no stamp field holds): a view reply is always
-- "<stamp>RS<view>", the stamp empty when the view was not cached
-- (jobs.viewFromReply cuts at the first RS).
local function view_stamp(f)
  return V_TAG .. (f[4] or '') .. US .. f[3] .. US .. (f[5] or '') .. '\30'
end

-- submit_fast answers a request that changes nothing but a counter — a
-- repeated join or skip on an active run — with one HMGET of 6 fields and
-- one HSET; the view comes from the cache ('v'), or, on the first such
-- request after a change, from an HMGET of VIEW_FIELDS that refills it.
-- A repeat is a request whose source and outcome already have their co
-- field in this run: the first of them went through submit_one, which
-- wrote that field in the same HSET as everything a join changes (the
-- source added to sources, a promotion to the people lane), and a run's
-- sources only grow, so a repeat changes nothing. want_view false (callers
-- that reply with outcomes only) skips the view.
-- Returns outcome and view (with its stamp), or nil — and false when
-- there is no record — when submit_one must decide.
local function submit_fast(task, src, policy, now, want_view)
  local po = POLICY_OUTCOME[policy]
  if po ~= 'joined' and po ~= 'skipped' then return nil end
  local nf = n_field(src, po)
  local f = rcall('HMGET', task, co_field(src, po), nf, unpk(FAST_READ))
  local status = f[3]
  if not status then return nil, false end
  if not (status == 'queued' or status == 'running' or status == 'retrying') then return nil, true end
  if not co_of_run(f[1], f[4]) then return nil, true end
  local count = repeat_count(f[2], now)
  if not want_view then
    rcall('HSET', task, nf, count)
    return po, ''
  end
  local stamp, v = view_stamp(f), f[6]
  if v and sfind(v, stamp, 1, true) == 1 then
    rcall('HSET', task, nf, count)
    return po, v
  end
  v = stamp .. view_reply(nil, rcall('HMGET', task, unpk(VIEW_FIELDS)), 0)
  rcall('HSET', task, nf, count, 'v', v)
  return po, v
end

-- follow_up_link keeps the trace context of a request merged into the
-- key's next run (queued, or replacing the active run) in the key's
-- follow-up links (submit.lua, when traced), which the script that starts
-- that run renames to its links (finish_terminal). The first such request
-- of a run (no follow-up queued yet, follow_up not '1') drops what a
-- follow-up that never started (cancelled) left there.
local function follow_up_link(a, follow_up)
  if not a.links_next then return end
  if follow_up ~= '1' then rcall('DEL', a.links_next) end
  if a.tp == '' then return end
  rcall('RPUSH', a.links_next, a.tp)
  rcall('LTRIM', a.links_next, 0, LINKS_MAX - 1)
  if tonum(a.retention) > 0 then rcall('PEXPIRE', a.links_next, a.retention) end
end

-- seen_subject adds a.key's subject to its scope's subjects ("subjects:
-- all"): a.subjects and a.subject when the caller declared them
-- (submit_many), else named from the partition tag a.tag (keyspace
-- Subjects) and split from a.key.
local function seen_subject(a, now)
  if a.subjects then
    rcall('ZADD', a.subjects, now, a.subject)
    return
  end
  local bar = sfind(a.key, '|', 1, true)
  rcall('ZADD', a.tag .. ':subjects-seen:' .. ssub(a.key, bar + 1), now, ssub(a.key, 1, bar - 1))
end

-- submit_one routes one TaskStartRequest (see submit.lua for the rules);
-- vals is submit_read's reply when the caller has it ({} for a key with
-- no record).
-- Dedup is by task key only; the source is recorded, never compared.
-- returns the outcome: started | joined | queued | skipped | replaced |
-- throttled, or duplicate when occ_field already holds occ or a later
-- occurrence (unix seconds) — this occurrence already reached the key, or a
-- newer one did; nothing is written.
local function submit_one(a, vals)
  local task, hist, now, src = a.task, a.hist, a.now, a.source
  vals = vals or submit_read(task, src, a.policy, a.occ ~= '' and a.occ_field or '')
  local X = 5 -- SUBMIT_READ starts at vals[X + 1]
  -- A repeat of this occurrence, or a late batch of an older one (a leader
  -- paused past its term), writes nothing: occurrences only move forward.
  if a.occ ~= '' and (tonum(vals[5]) or -1) >= tonum(a.occ) then
    return 'duplicate'
  end
  local cur, status = vals[X + 1], vals[X + 2]
  local active = status == 'queued' or status == 'running' or status == 'retrying'
  -- A new run (no active one, not throttled): nothing read is needed but
  -- whether the record exists, and the reply is what was written.
  -- the last success: a done run's finishedAt, or what new_run kept of an
  -- earlier one
  local last_success = status == 'done' and vals[X + 14] or nil
  local last = tonum(last_success or vals[X + 20])
  local throttled = not active and a.min_interval > 0 and last and (src == 'schedule' or src == 'foreground')
    and now - last < a.min_interval
  if not active and not throttled then
    new_run(task, a.q, hist, a.key, a.run_id, a.stages, a.max_attempts, src, src, now, status and true or false,
      vals[X + 24], last_success)
    hist_push(hist, a.cap, hist_ev(now, 'requested', a.run_id, src, '', 'started'))
    rcall('ZADD', a.index, now, a.key)
    if src ~= 'schedule' then seen_subject(a, now) end
    if a.occ ~= '' then rcall('HSET', task, a.occ_field, a.occ) end
    publish(a.part, task)
    -- the caller knows the rest of the new run's view (jobs.startedView)
    return 'started', now
  end
  local r = {}
  for i = 1, #SUBMIT_READ do r[SUBMIT_READ[i]] = vals[X + i] end
  local set = {} -- fields of the record written by one HSET at the end
  local function put(f, v)
    set[#set + 1] = f
    set[#set + 1] = v
    if r then r[f] = v end
  end
  local function coalesce(event, outcome, c, n)
    local f, v, new = hist_request(hist, a.cap, now, event, cur or '', src, outcome, c, n)
    put(f, v)
    if new then put('co', list_add(r.co, f)) end
  end
  -- "subjects: all" means every subject people or apps asked for within
  -- the retention (schedule requests do not keep a subject in the set). It
  -- is written when a run starts and when a source first joins a run, not
  -- for every repeat.
  local function seen()
    if src ~= 'schedule' then seen_subject(a, now) end
  end
  local outcome
  local changed = false -- whether the view changed (published only then)
  if not active then
    coalesce('throttled', 'throttled', vals[3], vals[4])
    outcome = 'throttled'
  elseif a.policy == 'join' then
    local srcs = list_add(r.sources, src)
    if srcs ~= r.sources then
      put('sources', srcs)
      seen()
      changed = true
    end
    coalesce('joined', 'joined', vals[1], vals[2])
    -- A person joining a queued bulk run promotes it to the people lane; a
    -- run parked by a paused scope (no entry) is re-queued there on resume.
    -- The bulk entry stays where it is (removing it from the middle of a
    -- long list is O(n)): whichever entry is claimed first starts the run,
    -- and the claim of the other finds the run started or over.
    if is_person(src) and status == 'queued' and r.lane ~= 'p' then
      if r.entry and r.entry ~= '' then
        put('entry', enqueue(a.q, 'p', cur, a.key, src))
      else
        put('plane', 'p')
      end
      put('lane', 'p')
      changed = true
    end
    if changed then put('updatedAt', now) end
    outcome = 'joined'
  elseif a.policy == 'skip' then
    coalesce('skipped', 'skipped', vals[1], vals[2])
    outcome = 'skipped'
  elseif a.policy == 'queue' then
    follow_up_link(a, r.followUp)
    put('followUp', '1')
    put('followUpSources', list_add(r.followUpSources, src))
    put('updatedAt', now)
    coalesce('requested', 'queued', vals[1], vals[2])
    outcome, changed = 'queued', true
  else
    -- replace: the active run is cancelled through the registry and a
    -- fresh run follows. A run nobody executes (queued, or waiting for its
    -- retry backoff) is ended here; a running one is flagged, and its
    -- holder ends it as cancelled, which starts the follow-up.
    hist_push(hist, a.cap, hist_ev(now, 'requested', cur, src, '', 'replaced'))
    follow_up_link(a, r.followUp)
    put('followUp', '1')
    put('followUpSources', src)
    if status == 'running' then
      put('cancel', '1')
      put('updatedAt', now)
      rcall(PUBLISH_CMD, a.tag .. ':cancels', cancel_payload(a.key, cur))
    else
      put('v', '')
      rcall('HSET', task, unpk(set))
      set = {}
      rcall('ZREM', a.tag .. ':retry', cur .. ' ' .. a.key)
      finish_terminal({task = task, q = a.q, hist = hist, cap = a.cap,
        retention = a.retention, next_run_id = a.run_id, stages = a.stages,
        max_attempts = a.max_attempts, now = now, links_from = a.links_next, links_to = a.links_new}, 'cancelled', 'replaced')
      r = nil -- rewritten: the caller reads the view again
    end
    outcome, changed = 'replaced', true
  end
  if a.occ ~= '' then put(a.occ_field, a.occ) end
  if changed then put('v', '') end -- the cached view (submit_fast)
  if #set > 0 then rcall('HSET', task, unpk(set)) end
  if changed then publish(a.part, task) end
  if not r then return outcome end -- rewritten: the caller reads the view
  return outcome, '\30' .. view_reply(r)
end

-- taken_pairs appends the entries of list (a popped lane's, or nil) to out
-- and their ZADD pairs (score due) to za from index j; returns the new j.
local function taken_pairs(za, j, out, list, due)
  if not list then return j end
  for i = 1, #list do
    za[j + 1], za[j + 2] = due, list[i]
    j = j + 2
    out[#out + 1] = list[i]
  end
  return j
end

-- read_lanes takes up to n entries of a partition, from lane `first` ('p'
-- or 'b') and from the other only for what is left, into the taken set
-- with score `due` (when they become reclaimable, ms), appending them to
-- out. When it took all it asked for, it rings the bell, so another idle
-- runner takes what may be left (without asking the lanes' lengths: a ring
-- with nothing left costs an idle runner one empty read, and a busy system
-- has a token waiting already, so the ring is one LLEN).
local function read_lanes(out, q, first, n, due)
  local other = first == 'p' and 'b' or 'p'
  local got, rest
  if has_lmpop then
    -- One call when the first lane is empty (it pops from the other) or
    -- has enough; a second only for the rest when it has fewer.
    local r = rcall('LMPOP', '2', q[first], q[other], 'LEFT', 'COUNT', int_str(n))
    if r then
      got = r[2]
      if r[1] == q[first] and #got < n then rest = rcall('LPOP', q[other], int_str(n - #got)) end
    end
  else
    got = rcall('LPOP', q[first], int_str(n))
    local k = got and #got or 0
    if k < n then rest = rcall('LPOP', q[other], int_str(n - k)) end
  end
  local za = {}
  local j = taken_pairs(za, 0, out, got, due)
  j = taken_pairs(za, j, out, rest, due)
  if j > 0 then rcall('ZADD', q.taken, unpk(za)) end
  if j == 2 * n then ring(q) end
  return out
end

-- recovery_mode mirrors checkpoints.Decide for the history event of a
-- recovered run: restart, resume or skip.
local function recovery_mode(done, cursor, n_stages)
  if done == 0 and (cursor == nil or cursor == false or cursor == '') then return 'restart' end
  if done >= n_stages then return 'skip' end
  return 'resume'
end

-- paused_scopes reads a partition's paused set: scope -> true, or nil
-- while nothing is paused (one SMEMBERS of an empty set: the only cost of
-- pause on the hot path).
local function paused_scopes(paused_key)
  local paused = nil
  for _, scope in ipairs(rcall('SMEMBERS', paused_key)) do
    paused = paused or {}
    paused[scope] = true
  end
  return paused
end

-- watch_and_paused returns whether the partition's watch key exists and its
-- paused scopes (paused_scopes) for a call that claims: one EXISTS of both
-- keys while neither exists — nobody watches, nothing is paused: the common
-- case — where the two checks cost a call each.
local function watch_and_paused(watch_key, paused_key)
  if rcall('EXISTS', watch_key, paused_key) == 0 then return false, nil end
  return rcall('EXISTS', watch_key) == 1, paused_scopes(paused_key)
end

-- scope_paused says whether the run of task is of a paused scope (paused:
-- paused_scopes' table), and returns its key's parts for parking.
local function scope_paused(paused, task)
  if not paused then return false end
  local key = rcall('HGET', task, 'key') or ''
  local bar = sfind(key, '|', 1, true)
  if not bar then return false end
  local scope = ssub(key, bar + 1)
  return paused[scope] == true, scope, ssub(key, 1, bar - 1)
end

-- claim_ending is what finish_terminal needs when a claim ends a run (rare).
-- A follow-up's run id '' is derived from the ended run's (follow_up_id).
local function claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id)
  if next_run_id == '' then next_run_id = follow_up_id(run_id) end
  return {task = task, q = c.q, hist = hist, cap = c.cap, retention = c.retention,
    next_run_id = next_run_id, stages = def_stages, max_attempts = def_max, now = c.now}
end

-- claim_entry decides on one entry a runner took — stale, busy, foreign,
-- paused or granted — and on a grant takes the lease with the key's next
-- fencing token and enters the first incomplete stage (claim.lua has the
-- reply's contract). c: {owner, cap, events, watch, watched (publish),
-- q (queue_at), retention, parked (key), paused (paused_scopes), now,
-- now_us (clock)}; task, lease_key, hist: the entry's run's keys; then the entry,
-- the lease TTL (ms), a follow-up run id (used if the claim ends the run and
-- a follow-up is queued; '' derives one, see claim_ending), and this
-- runner's definition of the run's job.
local function claim_entry(c, task, lease_key, hist, lane, entry_id, run_id, source, ttl, next_run_id, def_stages, def_max)
  local now, owner = c.now, c.owner
  local rec = rcall('HMGET', task, unpk(CLAIM_READ))
  local status = rec[2]
  if rec[1] ~= run_id or not (status == 'queued' or status == 'running' or status == 'retrying') then
    ack_entry(c.q, entry_id)
    return {'ack'}
  end
  -- The lease is taken first, with the key's next fencing token: one SET NX
  -- where a GET and a SET were two. A branch below that grants nothing
  -- drops it again (in this script: nobody sees it).
  local token = next_token(rec[6], c.now_us)
  if not rcall('SET', lease_key, lease_value(token, owner), 'NX', 'PX', ttl) then
    local holder = rcall('GET', lease_key) or ''
    local pttl = rcall('PTTL', lease_key)
    -- Make the entry reclaimable the moment the lease would expire, not a
    -- whole idle period later; a live holder's heartbeat moves it on.
    rcall('ZADD', c.q.taken, 'XX', now + pttl, entry_id)
    return {'busy', holder, pttl}
  end
  -- A cancel (or replace) ends the run at once, even during its retry backoff.
  if rec[3] == '1' then
    rcall('DEL', lease_key)
    finish_terminal(claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id), 'cancelled', 'cancelled')
    publish(c, task)
    return {'ack'}
  end
  -- nextAttemptAt is set only while retrying (the claim clears it)
  local next_at = status == 'retrying' and rcall('HGET', task, 'nextAttemptAt')
  if next_at and tonum(next_at) and tonum(next_at) > tonum(now) then
    rcall('DEL', lease_key)
    return {'busy', '', tonum(next_at) - now}
  end
  -- A paused scope: nobody claims its runs. The entry is acknowledged (so
  -- no runner keeps reading or reclaiming it) and the run is parked with
  -- the source it was requested by; the record stays queued, running with
  -- an expired lease, or retrying, and is claimed as such after resume.
  local is_paused, scope, subject = scope_paused(c.paused, task)
  if is_paused then
    rcall('DEL', lease_key)
    ack_entry(c.q, entry_id)
    rcall('ZADD', c.parked, 0, scope .. ' ' .. subject)
    rcall('HSET', task, 'entry', '', 'prun', run_id, 'psrc', source, 'plane', lane,
      'waiting', 'scope ' .. scope .. ' is paused', 'v', '')
    publish(c, task)
    return {'paused'}
  end
  -- Rolling deploys: a run whose remaining stages this runner does not
  -- define is left to a runner that does, never failed. The entry stays
  -- taken and is reclaimable at once (behind every entry due before it);
  -- the view says what it waits for.
  local missing = nil
  if def_stages == '' then
    missing = ''
  elseif def_stages ~= rec[8] then -- the same definition defines every stage
    local defined = {}
    for _, s in ipairs(split(def_stages, ',')) do defined[s] = true end
    local run_stages = split(rec[8], ',')
    for i = (tonum(rec[9]) or 0) + 1, #run_stages do
      if not defined[run_stages[i]] then missing = run_stages[i]; break end
    end
  end
  if missing then
    rcall('DEL', lease_key)
    local why
    if missing == '' then
      why = 'waiting for a runner that defines this job (' .. owner .. ' does not)'
    else
      why = 'waiting for a runner that defines stage ' .. missing .. ' (' .. owner .. ' does not)'
    end
    rcall('ZADD', c.q.taken, 'XX', now, entry_id)
    if rec[10] ~= why then
      rcall('HSET', task, 'waiting', why, 'v', '')
      publish(c, task)
    end
    return {'foreign', missing}
  end
  local attempt, max_attempts = tonum(rec[4]) or 0, tonum(rec[5]) or 1
  if status == 'running' then
    -- The previous holder's lease expired without a finish: it crashed,
    -- paused or was cut off.
    hist_push(hist, c.cap, hist_ev(now, 'lease-lost', run_id, '', '', '', rcall('HGET', task, 'owner'), rec[6]))
    if attempt >= max_attempts then
      rcall('DEL', lease_key)
      finish_terminal(claim_ending(c, task, hist, next_run_id, def_stages, def_max, run_id), 'failed', 'lease expired on the last attempt (' .. attempt .. ' of ' .. max_attempts .. ')')
      publish(c, task)
      return {'ack'}
    end
  end
  -- Hand the record to the new holder: the run keeps its completed stages
  -- and cursor, so a recovered run resumes.
  local done, cursor = tonum(rec[9]) or 0, rec[11] or ''
  local stage = list_at(rec[8], done + 1)
  local attempt_now = attempt + 1
  local sources = list_add(rec[7], source)
  local started = rec[12]
  -- Only what changes is written (a field written costs more than one
  -- read). The record's lane matters only while the run is queued
  -- (promotion), so the claim leaves it; the entry is written unread
  -- (reading it to skip an equal write saved nothing).
  local fields = {'status', 'running', 'stage', stage, 'owner', owner, 'token', tok_str(token),
    'attempt', int_str(attempt_now), 'entry', entry_id}
  if sources ~= rec[7] then
    fields[#fields + 1] = 'sources'
    fields[#fields + 1] = sources
  end
  if not started or started == '' then
    started = now
    fields[#fields + 1] = 'startedAt' -- also the record's updatedAt (jobs.viewFromValues)
  else
    fields[#fields + 1] = 'updatedAt'
  end
  fields[#fields + 1] = now
  if next_at and next_at ~= '' then
    fields[#fields + 1] = 'nextAttemptAt'
    fields[#fields + 1] = ''
  end
  if rec[10] and rec[10] ~= '' then
    fields[#fields + 1] = 'waiting'
    fields[#fields + 1] = ''
  end
  if rec[13] and rec[13] ~= '' then
    fields[#fields + 1] = 'v' -- the cached view (lib.lua submit_fast)
    fields[#fields + 1] = ''
  end
  rcall('HSET', task, unpk(fields))
  -- 'recovered' is reserved for crash recovery (the lease expired while
  -- running); a retry or a handed-back run is 'started' again, with its
  -- recovery mode as the outcome.
  local outcome = nil
  if attempt_now > 1 or done > 0 or cursor ~= '' then
    outcome = recovery_mode(done, cursor, #split(rec[8], ','))
  end
  hist_push(hist, c.cap, hist_ev(now, status == 'running' and 'recovered' or 'started', run_id, source, stage, outcome,
    owner, token))
  publish(c, task)
  return {'granted', token, done, cursor, attempt_now, rec[8], sources, started, status}
end

-- entry_parts splits an entry ("<lane><runId>US<task key>US<source>", the
-- key "<subject>|<scope>") into run id, task key, scope and source; nil
-- when it is not tasklease's.
local function entry_parts(e)
  local a = sfind(e, US, 2, true)
  local b = a and sfind(e, US, a + 1, true)
  local bar = b and sfind(e, '|', a + 1, true)
  if not bar or bar > b then return nil end
  return ssub(e, 2, a - 1), ssub(e, a + 1, b - 1), ssub(e, bar + 1, b - 1), ssub(e, b + 1)
end

-- claim_in_slot claims entry e (its parts from entry_parts) with
-- claim_entry, the run's record, lease and history keys derived under the
-- partition's hash tag: the caller took e in this same call, so it could
-- not pass them in KEYS; they are in the slot of the keys it did pass.
local function claim_in_slot(c, tag, e, run_id, key, source, ttl, next_run_id, stages, max_attempts)
  return claim_entry(c, tag .. ':task:' .. key, tag .. ':lease:' .. key, tag .. ':history:' .. key,
    ssub(e, 1, 1), e, run_id, source, ttl, next_run_id, stages, max_attempts)
end
