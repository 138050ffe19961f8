-- read_idle: take one entry from whichever of several idle partitions has
-- one — people's lanes before bulk lanes — and claim it for this runner
-- in the same call, as read_next.lua does for one partition. A runner that
-- has nothing to do waits on all its idle partitions' bells with one BLPOP
-- and sends this call in the same pipeline: Redis runs it as soon as the
-- wait ends, in the turn of the request that rang, and answers both
-- together (jobs.nodeWaiter). The BLPOP's reply names the bell that rang,
-- but this call cannot see it, so it looks at every lane it is given: one
-- LMPOP over all of them on Redis 7 (a call that finds nothing costs that
-- command and the call; LPOP per lane on Redis 6).
-- Single Redis server (or a Sentinel's primary) only: the lanes are in
-- different hash slots, which Redis Cluster refuses in one call.
-- KEYS[1..m] the idle partitions' bulk lanes, in the order they are looked
--            at: each one's hash tag names the partition's other keys
--            (queue_of), as read_next.lua's KEYS[1] does
-- ARGV[1] what is constant for this runner (read_next.lua's ARGV[3])
-- ARGV[2] the runner's token floor (read_next.lua's
--         ARGV[4])
-- returns {} when every lane is empty, else {i, more, entry, claim}: i the
-- index in KEYS of the entry's partition, more 1 when its lanes hold more
-- (their bell was rung), the entry and its claim reply (see claim.lua).
local m = #KEYS
local lanes = {}
for i = 1, m do
  lanes[i] = part_of(tag_of(KEYS[i])).q.p
  lanes[m + i] = KEYS[i]
end
local key, got
if has_lmpop then
  local args = {'LMPOP', int_str(2 * m)}
  for j = 1, 2 * m do args[j + 2] = lanes[j] end
  args[2 * m + 3], args[2 * m + 4], args[2 * m + 5] = 'LEFT', 'COUNT', '1'
  local r = rcall(unpk(args))
  if r then key, got = r[1], r[2][1] end
else
  for i = 1, 2 * m do
    got = rcall('LPOP', lanes[i])
    if got then
      key = lanes[i]
      break
    end
  end
end
if not got then return {} end
local i = 0
for j = 1, 2 * m do
  if lanes[j] == key then
    i = j > m and j - m or j
    break
  end
end
local now, now_us = clock()
now_us = floored(now_us, ARGV[2])
local tag = tag_of(KEYS[i])
local part = part_of(tag)
local cf = conf_fields(ARGV[1])
rcall('ZADD', part.q.taken, now + conf_num(cf[2]), got)
mark_due('t', part.q, now + conf_num(cf[2]), now)
-- Another idle runner takes what is left, if anything: asked here (two
-- LLEN) rather than rung blindly as read_lanes does, since a read that
-- found an idle partition's one request would wake a fetcher for nothing.
local more = rcall('LLEN', part.q.p) + rcall('LLEN', part.q.b) > 0
if more then ring(part.q) end
local out = claim_read(cf, tag, part, {got}, now, now_us)
return {i, more and 1 or 0, unpk(out)}
