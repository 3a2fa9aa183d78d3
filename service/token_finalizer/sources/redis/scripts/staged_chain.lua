-- Read-only: the staged calls above a call being staged, for its custody check.
-- ARGV: the parent's call id. Answers {call id, staging digest, ...} from that parent up to
-- its root, stopping at a call that is not staged (at most as many steps as calls staged).
local out = {}
local cursor = ARGV[1]
local steps = redis.call('HLEN', KEYS[14])
while cursor ~= '' and steps > 0 do
  local entry = redis.call('HGET', KEYS[14], cursor)
  if not entry then break end
  local space = string.find(entry, ' ', 1, true)
  out[#out + 1] = cursor
  out[#out + 1] = string.sub(entry, 1, space - 1)
  cursor = string.sub(entry, space + 1)
  steps = steps - 1
end
return out
