-- lib/queues.lua: a partition's request lanes, bell and taken set — how
-- requests are queued, read and acknowledged — and its paused scopes.

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
  return {b = tag .. ':q:b', p = tag .. ':q:p', bell = tag .. ':bell', taken = tag .. ':taken', tag = tag}
end

-- DUE_INDEX: whether scripts keep the due index, one sorted set naming the
-- partitions that have something coming due — "t<tag>" its taken set (a
-- lease to reclaim, a delayed run to start, an entry to re-ask), "r<tag>"
-- its retries — each scored at or before the earliest due time of that
-- set (ms, Redis time), so an idle runner reads one key instead of asking
-- every partition every second (jobs.Runner's timer). On a single Redis
-- server or a Sentinel's primary only: on a Cluster the partitions' keys
-- are in other slots, so runners ask each partition there. Set by
-- lua.Options.DueIndex, which replaces this line.
local DUE_INDEX = false

-- DUE_HORIZON_MS: a runner's timer reads the due index at least this often
-- (jobs.dueHorizon; TestDueHorizonMatches pins the two), so an entry due
-- later than that from now needs no wake-up: the timer reads it in time.
-- One due sooner, and before everything the index holds, is published on
-- the index's own channel, which the timers subscribe to.
local DUE_HORIZON_MS = 5000

-- due_key is the due index's name for a partition's hash tag
-- ("{<prefix>:p<n>}" -> "<prefix>:due", keyspace.Space.Due).
local function due_key(tag) return ssub(tag, 2, #tag - 1):match('^(.*):p%d+$') .. ':due' end

-- PARTS caches, by partition hash tag, the names of the partition's keys
-- that calls derive: q (queue_of), index, events (channel), watch,
-- paused, parked, retry, due (the due index, with DUE_INDEX). They are
-- the same strings on every call; in the Functions library they are made once per load instead of once per call
-- (each name a concatenation of ~800 instructions, the lanes' table
-- ~1,500). A deployment's partitions are few (keyspace.Space), so the
-- cache stays small. Read only: a call keeps its own state elsewhere.
local PARTS = {}

-- part_of is PARTS' entry for tag.
local function part_of(tag)
  local p = PARTS[tag]
  if not p then
    p = {q = queue_of(tag), index = tag .. ':index', events = tag .. ':events', watch = tag .. ':watch',
      paused = tag .. ':paused', parked = tag .. ':parked', retry = tag .. ':retry', due = DUE_INDEX and due_key(tag)}
    PARTS[tag] = p
  end
  return p
end

-- mark_due records that q's partition has something of kind ('t' taken,
-- 'r' retries) due at `at` (ms): ZADD LT, so the index keeps the earliest;
-- a wake-up for one due within the horizon and before all the rest. Costs
-- nothing without DUE_INDEX; with it one ZADD (a ZRANGE and a PUBLISH more
-- when due within the horizon).
local function mark_due(kind, q, at, now)
  if not DUE_INDEX then return end
  local tag = q.tag or tag_of(q.taken)
  local idx = part_of(tag).due
  if at - now < DUE_HORIZON_MS then
    local first = rcall('ZRANGE', idx, 0, 0, 'WITHSCORES')
    if not first[2] or tonum(at) < tonum(first[2]) then rcall(PUBLISH_CMD, idx, kind) end
  end
  rcall('ZADD', idx, 'LT', at, kind .. tag)
end

-- reset_due sets q's partition's entry of kind in the due index to the
-- earliest score of zkey (its taken set or retry queue), or removes it
-- when zkey is empty: what reclaim.lua and retry_move.lua leave after them.
local function reset_due(kind, q, zkey)
  if not DUE_INDEX then return end
  local tag = q.tag or tag_of(q.taken)
  local idx = part_of(tag).due
  local first = rcall('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  if first[2] then
    rcall('ZADD', idx, first[2], kind .. tag)
  else
    rcall('ZREM', idx, kind .. tag)
  end
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
-- has a token waiting already, so the ring is one LLEN). The due index
-- learns when the entries become due (mark_due; now: Redis time, ms).
local function read_lanes(out, q, first, n, due, now)
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
  if j > 0 then
    rcall('ZADD', q.taken, unpk(za))
    mark_due('t', q, due, now)
  end
  if j == 2 * n then ring(q) end
  return out
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
