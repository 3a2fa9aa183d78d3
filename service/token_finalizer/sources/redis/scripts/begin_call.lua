-- Announce a call; does not change the version.
-- ARGV: call id, abandoned TTL ms. Answers {'ok'} | {'frozen'} | {'retired'} | {'family'}.
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
if holds_staging() then return {'family'} end
redis.call('SADD', KEYS[5], ARGV[1])
touch(tonumber(ARGV[2]))
return {'ok'}
