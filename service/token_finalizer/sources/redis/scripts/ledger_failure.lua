-- Append a failure row; the same (call, reason) again is a replay.
-- ARGV: call id, the row as NeMo Gym's file ledger writes it, its marker field
-- ("\n" .. JSON [call id, reason]: no call id starts with a newline), abandoned TTL ms.
-- Answers {'new'} | {'same'} | {'frozen'} | {'retired'} | {'family'}.
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
if holds_entries() then return {'family'} end
if redis.call('HEXISTS', KEYS[10], ARGV[3]) == 1 then return {'same'} end
redis.call('RPUSH', KEYS[9], ARGV[2])
redis.call('HSET', KEYS[10], ARGV[3], '1')
-- The call's first row, if it has none yet: a later commit of it conflicts.
redis.call('HSETNX', KEYS[10], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[4]))
return {'new'}
