#!lua flags=allow-oom
-- Check one capture against the sweep rules and remove it when they say so, atomically.
-- ARGV: retired older than (s), abandoned older than (s, "" never), now (s, "" the server's
-- clock), "1" for a dry run, empty older than (s, "" never).
-- Answers {} (kept) or {reason, age}. "empty": frozen, not retired, and nothing in it
-- (no entry, no announced or failed call, no incomplete mark): what finalizing a never
-- captured id leaves behind.
local s = redis.call('HMGET', KEYS[1], 'retired', 'frozen', 'updated_at')
if not s[3] then return {} end
local clock = ARGV[3]
if clock == '' then clock = now() end
local age = tonumber(clock) - tonumber(s[3])
local reason
if s[1] and age >= tonumber(ARGV[1]) then
  reason = 'retired'
elseif ARGV[2] ~= '' and not s[1] and not s[2] and age >= tonumber(ARGV[2]) then
  reason = 'abandoned'
elseif ARGV[5] ~= '' and not s[1] and s[2] and age >= tonumber(ARGV[5])
    and redis.call('HLEN', KEYS[2]) == 0 and redis.call('SCARD', KEYS[5]) == 0
    and redis.call('SCARD', KEYS[6]) == 0 and not redis.call('HGET', KEYS[1], 'incomplete')
    and not holds_staging() then
  reason = 'empty'
else
  return {}
end
if ARGV[4] ~= '1' then redis.call('DEL', unpack(KEYS)) end
return {reason, tostring(age)}
