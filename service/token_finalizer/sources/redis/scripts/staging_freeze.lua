-- Read-only, after a freeze: a staging rollout's ledger rows and staged base snapshots.
-- Answers {'none'} (no ledger row and no staged call: a token rollout) | {'retired'}
--         | {'ok', {row, ...} in commit order, {call id, base JSON, ...}}.
if redis.call('HEXISTS', KEYS[1], 'retired') == 1 then return {'retired'} end
if not holds_staging() then return {'none'} end
return {'ok', redis.call('LRANGE', KEYS[9], 0, -1), redis.call('HGETALL', KEYS[12])}
