-- read_next: take up to n entries of one partition, from the preferred lane
-- first and from the other only for what is left, so a runner's free slots
-- go to people's requests before bulk work (lib.lua read_lanes).
-- (Blocking pops cannot run in a script; an idle runner blocks on the
-- partition's bell, then calls this.)
-- KEYS[1..4] the partition's queue keys (lib.lua queue_at)
-- ARGV[1] n   ARGV[2] the preferred lane's letter ('p' or 'b')
-- ARGV[3] reclaim idle (ms): the entries become reclaimable that long from now
-- returns the entries taken, in order
return read_lanes({}, queue_at(KEYS, 1), ARGV[2], tonumber(ARGV[1]), now_ms() + tonumber(ARGV[3]))
