-- cron_term: open a new cron leadership term (docs/cron.md). Each runner that
-- becomes the cron leader takes one; fan-out progress is fenced by it
-- (cron_adopt.lua, cron_progress.lua). Terms only grow, even when Redis
-- loses the counter (restart without persistence, failover to a lagging
-- replica, a flush): a term is max(previous + 1, Redis TIME in
-- microseconds), as the fencing tokens of lease_grant, so the counter may
-- expire (docs/concepts.md). Terms stay below 2^53.
-- KEYS[1] term counter ("<prefix>:cron:term")
-- ARGV[1] expiry of the counter (ms)
-- returns the new term (an integer)
local t = rcall('TIME')
local floor = tonum(t[1]) * 1000000 + tonum(t[2])
local prev = tonum(rcall('GET', KEYS[1]) or '0') or 0
local term = math.max(prev + 1, floor)
rcall('SET', KEYS[1], tok_str(term), 'PX', ARGV[1])
return term
