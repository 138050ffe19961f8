-- janitor: bound one partition's bookkeeping by live work and retention
-- (docs/concepts.md). Runners call it now and then; every step is idempotent.
--  * subjects: members not requested (by anything but a schedule) within
--    the retention leave the scope's subject set.
--  * index: a candidate whose record expired leaves the index; one whose
--    record still exists (a long-lived active run) is re-scored to now so
--    it is not examined again until another retention has passed.
-- (Taken entries of deleted records need no pass: the reclaim re-examines
-- them when they are due and the claim acknowledges them.)
-- KEYS[1] partition index
-- KEYS[2 .. 1+S] the partition's subject sets, one per scope
-- KEYS[2+S .. ] task records of the index candidates, in ARGV order
-- ARGV[1] retention (ms)   ARGV[2] S (number of subject sets)
-- ARGV[3 ..] index candidates (task keys), matching KEYS[2+S ..]
-- returns {subjects pruned, index entries pruned}
local now = now_ms()
local cutoff = now - tonum(ARGV[1])
local s = tonum(ARGV[2])
local subjects = 0
for i = 2, 1 + s do
  subjects = subjects + rcall('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. cutoff)
end
local index = 0
for i = 3, #ARGV do
  local member = ARGV[i]
  if rcall('EXISTS', KEYS[i - 1 + s]) == 0 then
    index = index + rcall('ZREM', KEYS[1], member)
  else
    rcall('ZADD', KEYS[1], 'XX', now, member)
  end
end
return {subjects, index}
