-- Store one call's entry line, write-once.
-- ARGV: call id, sha256 of the line, the line, the stored digest the caller has compared
-- with its own payload and found different ("" if none), abandoned TTL ms.
-- Answers {'new', version} | {'same'} | {'mismatch', stored digest, stored line}
--         | {'conflict', version} | {'frozen'} | {'retired'} | {'family'} (a staging rollout).
local call_id, digest, line, compared = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
if holds_staging() then return {'family'} end
local stored = redis.call('HGET', KEYS[3], call_id)
if stored == digest then return {'same'} end
if stored and stored ~= compared then
  -- other bytes: the caller decides whether they carry the same payload
  return {'mismatch', stored, redis.call('HGET', KEYS[2], call_id) or ''}
end
if stored then
  redis.call('HSET', KEYS[1], 'incomplete', '1')
  redis.call('SADD', KEYS[6], call_id)
  local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  touch(tonumber(ARGV[5]))
  return {'conflict', version}
end
redis.call('HSET', KEYS[2], call_id, line)
redis.call('HSET', KEYS[3], call_id, digest)
redis.call('RPUSH', KEYS[4], call_id)
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[5]))
return {'new', version}
