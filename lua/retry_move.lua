-- retry_move: move due retries back into the bulk lane with source
-- "retry". Atomic, so whichever runner gets there first moves each once.
-- KEYS[1] partition retry queue (members "<runId> <task key>")
-- KEYS[2..5] the partition's queue keys (lib/queues.lua queue_at)
-- ARGV[1] max entries to move
-- returns the number moved
-- With the due index (lua.Options.DueIndex) the partition's entry there is
-- set to its earliest retry left (or removed with the last): ZRANGE and
-- ZADD or ZREM more.
local due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonum(ARGV[1]))
local q = queue_at(KEYS, 2)
for _, member in ipairs(due) do
  local sp = sfind(member, ' ', 1, true)
  enqueue(q, 'b', ssub(member, 1, sp - 1), ssub(member, sp + 1), 'retry')
  rcall('ZREM', KEYS[1], member)
end
reset_due('r', q, KEYS[1])
return #due
