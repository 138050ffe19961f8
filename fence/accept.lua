-- accept: the Redis store's guard. Raises the key's highest accepted token
-- to ARGV[1] unless it is already higher.
-- KEYS[1] the key's fence (a string: the highest accepted token)
-- ARGV[1] token   ARGV[2] expiry (ms) of the fence after this acceptance, 0 for none
-- returns 1 accepted (equal or higher), 0 stale
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < cur then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
