-- Retire exactly one frozen snapshot: delete the data, keep the state as a tombstone.
-- ARGV: snapshot id, version (decimal), retired TTL ms (0: keep the tombstone).
-- Answers 1 (retired now or before) | 0 (not that snapshot).
local s = redis.call('HMGET', KEYS[1], 'frozen', 'retired', 'snapshot_id', 'version')
if not s[1] or s[3] ~= ARGV[1] or s[4] ~= ARGV[2] then return 0 end
if s[2] then return 1 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
local t = now()
redis.call('HSET', KEYS[1], 'retired', '1', 'retired_at', t, 'updated_at', t)
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
