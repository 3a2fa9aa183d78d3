-- Shared by every script of the redis capture store (docs/store-protocol.md#redis-store).
-- KEYS: 1 state, 2 entries, 3 digests, 4 order, 5 intents, 6 incomplete, 7 links, 8 lineage
-- (the lineage index, docs/store-protocol.md#lineage-index), and external staging's 9 ledger,
-- 10 ledger_ids, 11 ledger_fp, 12 staged, 13 staged_extras, 14 staged_index, 15 staged_cleared
-- (one rollout's keys, all under its hash tag; docs/staging.md#storage). Flags in the state
-- hash are "1" or absent; HMGET answers false for an absent field.

-- The server's clock as "seconds.microseconds", so ages agree across machines.
local function now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- A write to the capture: note when; while it is open, push its expiry out.
local function touch(ttl_ms)
  local t = now()
  redis.call('HSETNX', KEYS[1], 'created_at', t)
  redis.call('HSET', KEYS[1], 'updated_at', t)
  if ttl_ms > 0 then
    for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl_ms) end
  end
end

-- A rollout holds token entries or staging, never both: what each family has written.
local function holds_entries()
  return redis.call('EXISTS', KEYS[2], KEYS[5], KEYS[6]) > 0
      or redis.call('HEXISTS', KEYS[1], 'incomplete') == 1
end

local function holds_staging()
  return redis.call('EXISTS', KEYS[9], KEYS[12], KEYS[15]) > 0
end

-- The stored entry lines in put order (freeze, committed); nil and the call id
-- whose line is missing when the capture is corrupt.
local function stored_lines()
  local ids = redis.call('LRANGE', KEYS[4], 0, -1)
  local lines = {}
  for i = 1, #ids do
    local line = redis.call('HGET', KEYS[2], ids[i])
    if not line then return nil, ids[i] end
    lines[i] = line
  end
  return lines
end
