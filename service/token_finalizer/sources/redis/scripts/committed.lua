-- Read-only: the stored lines in put order, without freezing; none once retired.
-- Answers {'ok', {line, ...}} | {'corrupt', call id}.
if redis.call('HEXISTS', KEYS[1], 'retired') == 1 then return {'ok', {}} end
local lines, missing = stored_lines()
if not lines then return {'corrupt', missing} end
return {'ok', lines}
