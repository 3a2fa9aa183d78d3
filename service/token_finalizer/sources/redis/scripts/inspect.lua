-- Read-only: what `store inspect` reports. Answers {state pairs, entry count,
-- failed call ids, announced call ids without an entry, announced count, the
-- positions in KEYS of the keys that exist}.
local missing = {}
local intents = redis.call('SMEMBERS', KEYS[5])
for i = 1, #intents do
  if redis.call('HEXISTS', KEYS[3], intents[i]) == 0 then missing[#missing + 1] = intents[i] end
end
local present = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then present[#present + 1] = i end
end
return {redis.call('HGETALL', KEYS[1]), redis.call('HLEN', KEYS[3]),
        redis.call('SMEMBERS', KEYS[6]), missing, #intents, present}
