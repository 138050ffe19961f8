-- read_next: read up to n new entries of one partition for this consumer,
-- from the preferred lane first and from the other only for what is left,
-- so a runner's free slots go to people's requests before bulk work.
-- (Blocking reads cannot run in a script; the runner's idle read is an
-- XREADGROUP BLOCK over both lanes.)
-- KEYS[1] preferred lane's stream   KEYS[2] the other lane's stream
-- ARGV[1] group   ARGV[2] consumer   ARGV[3] n
-- ARGV[4] lane letter of KEYS[1]   ARGV[5] lane letter of KEYS[2]
-- returns a flat list: lane letter, entry id, then the entry's fields as
-- one list {name, value, ...}, per entry
local out = {}
local want = tonumber(ARGV[3])
for i = 1, 2 do
  if want <= 0 then break end
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', KEYS[i], '>')
  if res then
    for _, e in ipairs(res[1][2]) do
      out[#out + 1] = ARGV[3 + i]
      out[#out + 1] = e[1]
      out[#out + 1] = e[2]
      want = want - 1
    end
  end
end
return out
