-- Store one call's entry line, write-once, and index it for lineage resolution.
-- ARGV: call id, sha256 of the line, the line, the stored digest the caller has compared
-- with its own payload and found different ("" if none), abandoned TTL ms, then the
-- lineage index's part (docs/store-protocol.md#lineage-index): a fresh epoch (kept only
-- by the rollout's first put), the call's link, its fingerprint ("" when no request can
-- continue it) and its candidate record "call_id context_len context_digest\n"; then the
-- call a packed value refers to for its prompt's prefix ("" if none) and the digest the
-- caller knows that call by (docs/store-protocol.md#packed-at-rest).
-- Answers {'new', version, epoch} | {'same'} | {'mismatch', stored digest, stored line}
--         | {'rebase'} (the referred call is not stored with that digest)
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
if ARGV[10] ~= '' and redis.call('HGET', KEYS[3], ARGV[10]) ~= ARGV[11] then
  return {'rebase'}
end
redis.call('HSET', KEYS[2], call_id, line)
redis.call('HSET', KEYS[3], call_id, digest)
redis.call('RPUSH', KEYS[4], call_id)
redis.call('HSETNX', KEYS[1], 'lineage_epoch', ARGV[6])
redis.call('HSET', KEYS[7], call_id, ARGV[7])
if ARGV[8] ~= '' then
  local listed = redis.call('HGET', KEYS[8], ARGV[8]) or ''
  redis.call('HSET', KEYS[8], ARGV[8], listed .. ARGV[9])
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[5]))
return {'new', version, redis.call('HGET', KEYS[1], 'lineage_epoch')}
