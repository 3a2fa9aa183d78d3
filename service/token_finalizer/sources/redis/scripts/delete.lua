#!lua flags=allow-oom
-- Admin only: remove every key of one rollout, tombstone included; answers the keys removed.
local removed = {}
for i = 1, #KEYS do
  if redis.call('DEL', KEYS[i]) == 1 then removed[#removed + 1] = KEYS[i] end
end
return removed
