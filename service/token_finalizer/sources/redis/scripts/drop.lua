#!lua flags=allow-oom
-- Retire exactly one frozen snapshot: delete the data, keep the state as a tombstone.
-- ARGV: snapshot id, version (decimal), retired TTL ms (0: keep the tombstone).
-- Answers 1 (retired now or before) | 0 (not that snapshot).
local s = redis.call('HMGET', KEYS[1], 'frozen', 'retired', 'snapshot_id', 'version')
if not s[1] or s[3] ~= ARGV[1] or s[4] ~= ARGV[2] then return 0 end
if s[2] then return 1 end
-- Every data key, staging's included (orphaned staged calls go with their rollout).
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
local t = now()
redis.call('HSET', KEYS[1], 'retired', '1', 'retired_at', t, 'updated_at', t)
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
