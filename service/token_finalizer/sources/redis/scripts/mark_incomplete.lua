#!lua flags=allow-oom
-- Record that a call (or the rollout as a whole) failed to capture; allowed after a freeze.
-- ARGV: call id ("" for the rollout as a whole), abandoned TTL ms.
-- Answers {'ok', version} | {'retired'} | {'family'} (a staging rollout).
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if holds_staging() then return {'family'} end
redis.call('HSET', KEYS[1], 'incomplete', '1')
if ARGV[1] ~= '' then redis.call('SADD', KEYS[6], ARGV[1]) end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
if flags[2] then touch(0) else touch(tonumber(ARGV[2])) end
return {'ok', version}
