-- The mask-fraction guard's count of one finalize (service/redis_guard.py).
-- KEYS[1] the run's hash. ARGV: masked ("1"/"0"), mask reason, min samples,
-- max mask fraction (Python's repr: strtod reads back the same double), TTL ms.
-- Answers nil while the run is not tripped, else HGETALL of the run.
local finalized = redis.call('HINCRBY', KEYS[1], 'finalized', 1)
local masked
if ARGV[1] == '1' then
  masked = redis.call('HINCRBY', KEYS[1], 'masked', 1)
  redis.call('HINCRBY', KEYS[1], 'reason:' .. ARGV[2], 1)
else
  masked = tonumber(redis.call('HGET', KEYS[1], 'masked') or '0')
end
local tripped = redis.call('HGET', KEYS[1], 'tripped') == '1'
if not tripped and finalized >= tonumber(ARGV[3])
    and masked / finalized > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], 'tripped', '1')
  tripped = true
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if tripped then
  return redis.call('HGETALL', KEYS[1])
end
return false
