-- Read-only: the stored lines in put order, without freezing; none once retired.
-- Answers {'ok', {line, ...}} | {'corrupt', call id}.
if redis.call('HEXISTS', KEYS[1], 'retired') == 1 then return {'ok', {}} end
local ids = redis.call('LRANGE', KEYS[4], 0, -1)
local lines = {}
for i = 1, #ids do
  local line = redis.call('HGET', KEYS[2], ids[i])
  if not line then return {'corrupt', ids[i]} end
  lines[i] = line
end
return {'ok', lines}
