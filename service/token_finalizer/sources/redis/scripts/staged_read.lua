-- Read-only: staged calls. ARGV: 'base' (base snapshot JSON) or 'rest' (attachments and
-- extras JSON), then call ids. Answers one value per id, false where nothing is staged;
-- nothing once retired.
if redis.call('HEXISTS', KEYS[1], 'retired') == 1 then return {} end
local key = KEYS[12]
if ARGV[1] == 'rest' then key = KEYS[13] end
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
return redis.call('HMGET', key, unpack(ids))
