-- Append a committed ledger row, write-once per call id across both row kinds.
-- ARGV: call id, the row as NeMo Gym's file ledger writes it, its fingerprint ("" for none),
-- abandoned TTL ms.
-- Answers {'new'} | {'same'} | {'conflict'} | {'frozen'} | {'retired'} | {'family'}.
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
if holds_entries() then return {'family'} end
local call_id, row, fingerprint = ARGV[1], ARGV[2], ARGV[3]
-- The first row of a call decides: the same row again is a replay, anything else
-- (a failure row stored first included) a conflict.
local first = redis.call('HGET', KEYS[10], call_id)
if first then
  if first == row then return {'same'} end
  return {'conflict'}
end
redis.call('RPUSH', KEYS[9], row)
redis.call('HSET', KEYS[10], call_id, row)
if fingerprint ~= '' then
  local ids = redis.call('HGET', KEYS[11], fingerprint)
  if ids then ids = ids .. '\n' .. call_id else ids = call_id end
  redis.call('HSET', KEYS[11], fingerprint, ids)
end
redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[4]))
return {'new'}
