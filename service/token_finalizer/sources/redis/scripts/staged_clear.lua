#!lua flags=allow-oom
-- Delete exactly the named staged calls: base snapshot, extras and attachments, index entry
-- (docs/staging.md#clearing-staged-calls). Each one deleted is remembered in staged_cleared,
-- so it is never staged again; a call that is not staged changes nothing. Allowed at
-- maxmemory: it frees what a rollout's tokens hold.
-- ARGV: abandoned TTL ms, then call ids. Answers {'ok', how many were staged} | {'frozen'};
-- a retired rollout holds nothing: {'ok', 0}.
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'ok', 0} end
if flags[2] then return {'frozen'} end
local held = 0
for i = 2, #ARGV do
  local call_id = ARGV[i]
  if redis.call('HDEL', KEYS[12], call_id) == 1 then
    redis.call('HDEL', KEYS[13], call_id)
    redis.call('HDEL', KEYS[14], call_id)
    redis.call('SADD', KEYS[15], call_id)
    held = held + 1
  end
end
if held > 0 then touch(tonumber(ARGV[1])) end
return {'ok', held}
