-- reclaim: take up to n entries of a partition whose time in the taken set
-- is up — their holder stopped heartbeating, or a claim left them for later
-- (busy, foreign, handed back) — scoring them a reclaim idle time ahead, so
-- the pass of another runner does not take them too. The claim that
-- follows re-examines each against the record and the lease. Entries come
-- in the order they became due: one rescored at once (foreign) goes behind
-- every entry due before it, so none holds the others back.
-- With ARGV[5] = '1' it first drains the legacy request streams of the
-- partition (versions before request lists) into the lanes: entries no
-- runner of an older version read yet, and pending ones idle past the
-- reclaim idle time whose run holds no lease (their older holder died: a
-- live one renews the lease, under its own TTL, and keeps its entry); a
-- drained stream with nothing pending is deleted, group and all. So the
-- requests of older runners in a rolling deploy are served by this
-- version, and a fresh install never has a stream.
-- KEYS[1..4] the partition's queue keys (lib/queues.lua queue_at)
-- KEYS[5] legacy bulk request stream   KEYS[6] legacy people request stream
-- ARGV[1] n   ARGV[2] reclaim idle (ms)   ARGV[3] legacy consumer group
-- ARGV[4] consumer name for drained entries   ARGV[5] '1': drain the legacy streams
-- returns the entries taken
-- A pending entry's run's lease key, "<tag>:lease:<task key>", is derived
-- from the stream's hash tag (as finish.lua derives keys): in its slot.
-- With the due index (lua.Options.DueIndex) the partition's entry there is
-- set to its taken set's earliest time, or removed with the last entry.
-- Cost: ZRANGEBYSCORE, TIME, ZADD for what it takes (with the due index a
-- ZRANGE and a ZADD or ZREM more); the drain two EXISTS
-- while no legacy stream is left (while one is, per pending entry idle
-- past the reclaim idle, up to 4n, an XRANGE and an EXISTS of its lease).
local q = queue_at(KEYS, 1)
local now = now_ms()
local idle = tonum(ARGV[2])

-- move_legacy queues one legacy stream message {id, {field, value, ...}}
-- on lane, if it is tasklease's.
local function move_legacy(lane, msg)
  local f = {}
  local kv = msg[2] or {}
  for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
  if f.key and f.runId then enqueue(q, lane, f.runId, f.key, f.source or 'retry') end
end

local function drain(stream, lane, n)
  if rcall('EXISTS', stream) == 0 then return end
  local group, consumer = ARGV[3], ARGV[4]
  -- (more than n: some may be live holders' and left)
  local pend = redis.pcall('XPENDING', stream, group, 'IDLE', idle, '-', '+', 4 * n)
  if type(pend) == 'table' and pend.err then -- no group: nobody consumed it
    for _, m in ipairs(rcall('XRANGE', stream, '-', '+', 'COUNT', n)) do
      move_legacy(lane, m)
      rcall('XDEL', stream, m[1])
    end
    if rcall('XLEN', stream) == 0 then rcall('DEL', stream) end
    return
  end
  -- A pending entry is dead only when its holder's own lease could have
  -- expired: an older runner refreshes its entry every third of its
  -- job's lease TTL, which may be longer than this runner's reclaim idle,
  -- so idle time alone would take (and acknowledge, and delete with the
  -- stream and group) a live holder's entry, failing its next heartbeat.
  -- The entries whose run's lease is live are left pending.
  local msgs, ids = {}, {}
  for _, p in ipairs(pend) do
    local m = rcall('XRANGE', stream, p[1], p[1])[1]
    local f = m and m[2] or {}
    local key = nil
    for i = 1, #f, 2 do
      if f[i] == 'key' then key = f[i + 1] end
    end
    if not key or rcall('EXISTS', tag_of(stream) .. ':lease:' .. key) == 0 then
      ids[#ids + 1] = p[1]
      if #ids == n then break end
    end
  end
  if #ids > 0 then
    msgs = rcall('XCLAIM', stream, group, consumer, idle, unpk(ids))
  end
  local fresh = rcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', stream, '>')
  if fresh then
    for _, m in ipairs(fresh[1][2]) do msgs[#msgs + 1] = m end
  end
  for _, m in ipairs(msgs) do
    if type(m) == 'table' then
      move_legacy(lane, m)
      rcall('XACK', stream, group, m[1])
      rcall('XDEL', stream, m[1])
    end
  end
  if rcall('XLEN', stream) == 0 and rcall('XPENDING', stream, group)[1] == 0 then
    rcall('DEL', stream)
  end
end

if ARGV[5] == '1' then
  drain(KEYS[5], 'b', tonum(ARGV[1]))
  drain(KEYS[6], 'p', tonum(ARGV[1]))
end

local due = rcall('ZRANGEBYSCORE', q.taken, '-inf', now, 'LIMIT', 0, tonum(ARGV[1]))
if #due > 0 then
  local za = {}
  local until_ms = now + idle
  for i = 1, #due do za[2 * i - 1], za[2 * i] = until_ms, due[i] end
  rcall('ZADD', q.taken, 'XX', unpk(za))
end
reset_due('t', q, q.taken)
return due
