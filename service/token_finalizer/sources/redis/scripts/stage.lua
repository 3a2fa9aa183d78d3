-- Store one staged call, write-once, after the caller's custody check.
-- ARGV: call id, parent call id ("" for a root), the parent's staging digest the custody
-- check read ("" for a root), the base snapshot as stored (packed since 0.5.0,
-- docs/staging.md#packed-at-rest), attachments and extras JSON, this call's staging digest,
-- abandoned TTL ms.
-- Answers {'new'} | {'same'} | {'conflict', stored base, stored rest} (the caller tells a
-- call stored in another form from a conflict) | {'cleared'} (staged once, then cleared:
-- never again) | {'parent_changed'} (the parent is no longer the one checked) | {'frozen'}
-- | {'retired'} | {'family'}.
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
if holds_entries() then return {'family'} end
local call_id = ARGV[1]
local stored = redis.call('HGET', KEYS[12], call_id)
if stored then
  local rest = redis.call('HGET', KEYS[13], call_id)
  if stored == ARGV[4] and rest == ARGV[5] then
    return {'same'}
  end
  -- The caller tells a call stored in another form (before 0.5.0) from a conflict.
  return {'conflict', stored, rest or ''}
end
if redis.call('SISMEMBER', KEYS[15], call_id) == 1 then return {'cleared'} end
if ARGV[2] ~= '' then
  local parent = redis.call('HGET', KEYS[14], ARGV[2])
  if not parent or string.sub(parent, 1, #ARGV[3] + 1) ~= ARGV[3] .. ' ' then
    return {'parent_changed'}
  end
end
redis.call('HSET', KEYS[12], call_id, ARGV[4])
redis.call('HSET', KEYS[13], call_id, ARGV[5])
redis.call('HSET', KEYS[14], call_id, ARGV[6] .. ' ' .. ARGV[2])
redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[7]))
return {'new'}
