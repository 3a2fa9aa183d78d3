-- Read-only: the ledger. ARGV: 'count' (the number of rows), 'rows' ({row, ...} in commit
-- order) or 'inspect' ({{row, ...}, {staged call id, ...}, cleared calls}). Nothing once
-- retired.
local retired = redis.call('HEXISTS', KEYS[1], 'retired') == 1
if ARGV[1] == 'count' then
  if retired then return 0 end
  return redis.call('LLEN', KEYS[9])
end
if retired then
  if ARGV[1] == 'inspect' then return {{}, {}, 0} end
  return {}
end
if ARGV[1] == 'inspect' then
  return {redis.call('LRANGE', KEYS[9], 0, -1), redis.call('HKEYS', KEYS[12]),
          redis.call('SCARD', KEYS[15])}
end
return redis.call('LRANGE', KEYS[9], 0, -1)
