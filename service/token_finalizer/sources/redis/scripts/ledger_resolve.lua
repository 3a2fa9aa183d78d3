-- Read-only: the committed rows a request with this fingerprint may continue.
-- ARGV: fingerprint. Answers {'none'} when the rollout holds no ledger row (it may hold
-- token entries), else {'ok', {row, ...}}: only that fingerprint's rows are read.
if redis.call('EXISTS', KEYS[9]) == 0 then return {'none'} end
local rows = {}
local ids = redis.call('HGET', KEYS[11], ARGV[1])
if ids then
  for call_id in string.gmatch(ids, '[^\n]+') do
    local row = redis.call('HGET', KEYS[10], call_id)
    if row then rows[#rows + 1] = row end
  end
end
return {'ok', rows}
