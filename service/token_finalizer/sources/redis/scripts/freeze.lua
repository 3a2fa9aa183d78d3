#!lua flags=allow-oom
-- Freeze (idempotent) and read the snapshot in the same script.
-- ARGV: a fresh snapshot id, used only by the first freeze.
-- Answers {'ok', snapshot_id, version, incomplete 0/1, {line, ...} in put order}
--         | {'retired'} | {'corrupt', call id}.
local s = redis.call('HMGET', KEYS[1], 'retired', 'frozen', 'snapshot_id', 'version', 'incomplete')
if s[1] then return {'retired'} end
local snapshot_id, version = s[3], s[4]
if not s[2] then
  snapshot_id = ARGV[1]
  version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  local t = now()
  redis.call('HSETNX', KEYS[1], 'created_at', t)
  redis.call('HSET', KEYS[1], 'frozen', '1', 'snapshot_id', snapshot_id,
             'frozen_at', t, 'updated_at', t)
  -- A frozen capture that is not retired is evidence: it never expires.
  for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]) end
end
local lines, missing = stored_lines()
if not lines then return {'corrupt', missing} end
local incomplete = 0
if s[5] then
  incomplete = 1
else
  local intents = redis.call('SMEMBERS', KEYS[5])
  for i = 1, #intents do
    if redis.call('HEXISTS', KEYS[3], intents[i]) == 0 then
      incomplete = 1
      break
    end
  end
end
return {'ok', snapshot_id, version, incomplete, lines}
