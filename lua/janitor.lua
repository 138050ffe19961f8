-- janitor: bound one partition's bookkeeping by live work and retention
-- (DESIGN §2.6). Runners call it now and then; every step is idempotent.
--  * subjects: members not requested (by anything but a schedule) within
--    the retention leave the scope's subject set.
--  * index: a candidate whose record expired leaves the index; one whose
--    record still exists (a long-lived active run) is re-scored to now so
--    it is not examined again until another retention has passed.
--  * consumers: consumer-group members (runners of earlier deploys) with no
--    pending entries, idle longer than ARGV[3], are deleted. A consumer that
--    still has pending entries is left alone: reclaim moves them first.
-- KEYS[1] partition index   KEYS[2] bulk request stream   KEYS[3] people request stream
-- KEYS[4 .. 3+S] the partition's subject sets, one per scope
-- KEYS[4+S .. ] task records of the index candidates, in ARGV order
-- ARGV[1] retention (ms)   ARGV[2] S (number of subject sets)
-- ARGV[3] consumer idle limit (ms)   ARGV[4] group   ARGV[5] this runner's consumer name
-- ARGV[6 ..] index candidates (task keys), matching KEYS[3+S ..]
-- returns {subjects pruned, index entries pruned, consumers deleted}
local now = now_ms()
local cutoff = now - tonumber(ARGV[1])
local s = tonumber(ARGV[2])
local subjects = 0
for i = 4, 3 + s do
  subjects = subjects + redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. cutoff)
end
local index = 0
for i = 6, #ARGV do
  local member = ARGV[i]
  if redis.call('EXISTS', KEYS[i - 2 + s]) == 0 then
    index = index + redis.call('ZREM', KEYS[1], member)
  else
    redis.call('ZADD', KEYS[1], 'XX', now, member)
  end
end
local consumers = 0
-- A consumer is deleted only when it is idle with nothing pending in both
-- lanes (XGROUP DELCONSUMER drops its pending entries).
local idle = {}
for lane = 2, 3 do
  if redis.call('EXISTS', KEYS[lane]) == 1 then
    local list = redis.pcall('XINFO', 'CONSUMERS', KEYS[lane], ARGV[4])
    if type(list) == 'table' and not list.err then
      for _, c in ipairs(list) do
        local f = {}
        for j = 1, #c, 2 do f[c[j]] = c[j + 1] end
        local quiet = f.name ~= ARGV[5] and tonumber(f.pending) == 0 and tonumber(f.idle) > tonumber(ARGV[3])
        if idle[f.name] == nil or not quiet then idle[f.name] = quiet end
      end
    end
  end
end
for name, quiet in pairs(idle) do
  if quiet then
    for lane = 2, 3 do
      if redis.call('EXISTS', KEYS[lane]) == 1 then redis.pcall('XGROUP', 'DELCONSUMER', KEYS[lane], ARGV[4], name) end
    end
    consumers = consumers + 1
  end
end
return {subjects, index, consumers}
