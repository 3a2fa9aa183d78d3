-- Read-only: what the lineage index holds for one resolve request, and nothing else
-- (docs/store-protocol.md#lineage-index).
-- ARGV: mode, the epoch of the caller's cached chains, the delta depth limit, the number
-- S of calls whose chains the caller holds, those S call ids, then per mode:
--   'candidates': the request's fingerprint, then its context digests d0 .. dn;
--   'chain': the chosen call id.
-- 'candidates' keeps the fingerprint's candidates whose context the request starts with,
-- and walks their delta chains over the links; with exactly one, it also returns the
-- lines the caller needs to rebuild its cumulative ids. 'chain' does that for one call.
-- A walk stops at a full-prompt anchor, at a call the caller holds (when the epochs
-- agree), at a call missing from the index, at a repeat, or past the depth limit.
-- Answers {'ok', epoch, {id, context_len, context_digest, ...}, {id, link, ...},
--          {id, line, ...}} | {'retired'} | {'unindexed'} (entries written without links).
local s = redis.call('HMGET', KEYS[1], 'retired', 'lineage_epoch')
if s[1] then return {'retired'} end
if redis.call('HLEN', KEYS[7]) ~= redis.call('HLEN', KEYS[2]) then return {'unindexed'} end
local epoch = s[2] or ''
local depth_limit = tonumber(ARGV[3])
local held_count = tonumber(ARGV[4])
local held = {}
if epoch == ARGV[2] then
  for i = 1, held_count do held[ARGV[4 + i]] = true end
end
local rest = 5 + held_count
local links, lines, seen = {}, {}, {}

-- A packed value that refers to its parent's ids (docs/store-protocol.md#packed-at-rest)
-- needs the parent's line too, whatever the caller holds, down to a value that does not.
local function refers(line)
  return string.sub(line, 1, 5) == '\147NGP1' and string.byte(line, 7) == 1
end

local function walk(id, want_lines)
  local steps = 0
  local needed = false
  while id ~= '' and not seen[id] and (steps <= depth_limit or needed) do
    seen[id] = true
    local link = redis.call('HGET', KEYS[7], id)
    if not link then return end
    links[#links + 1] = id
    links[#links + 1] = link
    if held[id] and not needed then return end
    local ref = false
    if want_lines then
      local line = redis.call('HGET', KEYS[2], id) or ''
      lines[#lines + 1] = id
      lines[#lines + 1] = line
      ref = refers(line)
    end
    local parent, delta, cum_len = string.match(link, '^([^\n]*)\n(%d)\n%d+\n(%d*)\n')
    -- Without lines, only a length is wanted: a recorded cum_len gives it at once.
    if not ref and (delta ~= '1' or (not want_lines and cum_len ~= '')) then return end
    needed = ref
    id = parent
    steps = steps + 1
  end
end

if ARGV[1] == 'chain' then
  walk(ARGV[rest], true)
  return {'ok', epoch, {}, links, lines}
end
local candidates = {}
local listed = redis.call('HGET', KEYS[8], ARGV[rest])
if listed then
  local digest_count = #ARGV - rest
  for id, context_len, context_digest in string.gmatch(listed, '(%S+) (%d+) (%x+)\n') do
    local k = tonumber(context_len)
    if k < digest_count and ARGV[rest + 1 + k] == context_digest then
      candidates[#candidates + 1] = id
      candidates[#candidates + 1] = context_len
      candidates[#candidates + 1] = context_digest
    end
  end
end
local single = #candidates == 3
for i = 1, #candidates, 3 do walk(candidates[i], single) end
return {'ok', epoch, candidates, links, lines}
