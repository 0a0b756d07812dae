-- Fairness across the fleet (`src/admission/redis/service.rs`): one replica's heartbeat.
-- A line is a lane's queue (`small`, `large:long`, ...): the requests in it wait for the same
-- seats. Counters and waiting entries are kept per line and tenant: `<line>|<tenant field>`
-- (the field: 16 hex of a hash of the tenant's name).
-- KEYS[1]: HASH of service, tokens over the tenant's share, field `<line>|<tenant field>`;
--          field `<line>|_v`: the least counter among the tenants waiting in the line, the
--          last time any waited.
-- KEYS[2]: HASH of who waits where: field `<line>|<tenant field>`, value: until when (ms of
--          Redis server time) the entry counts; expired entries are dropped here.
-- ARGV[1]: how long this call's entries count (ms).
-- ARGV[2..]: `<line>|<tenant field>` for each tenant waiting in each of this replica's lines.
-- A tenant that starts waiting in a line (no entry counts for it there) is lifted to the least
-- counter among the tenants already waiting in it (or to the line's `_v` when none waits):
-- service it received while nobody else waited is no debt, and idle time banks no credit.
-- Replies {counters as HGETALL, the entries that count (this call's included)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])

local function line_of(entry)
  return string.match(entry, '^(.*)|[^|]+$')
end
local function counter(entry)
  return tonumber(redis.call('HGET', KEYS[1], entry) or '0')
end

-- line -> {entry -> true}
local waiting = {}
local function wait(entry)
  local line = line_of(entry)
  waiting[line] = waiting[line] or {}
  waiting[line][entry] = true
end
-- The least counter among the tenants waiting in `line` (nil when none waits).
local function least(line)
  local low = nil
  for entry in pairs(waiting[line] or {}) do
    local c = counter(entry)
    if low == nil or c < low then
      low = c
    end
  end
  return low
end

local live = {}
local entries = redis.call('HGETALL', KEYS[2])
for i = 1, #entries, 2 do
  if tonumber(entries[i + 1]) < now then
    redis.call('HDEL', KEYS[2], entries[i])
  else
    live[#live + 1] = entries[i]
    wait(entries[i])
  end
end

for i = 2, #ARGV do
  local entry = ARGV[i]
  local line = line_of(entry)
  if line and not (waiting[line] and waiting[line][entry]) then
    local floor = least(line) or tonumber(redis.call('HGET', KEYS[1], line .. '|_v') or '0')
    if counter(entry) < floor then
      redis.call('HSET', KEYS[1], entry, tostring(floor))
    end
    wait(entry)
  end
  if redis.call('HSET', KEYS[2], entry, now + ttl) == 1 then
    live[#live + 1] = entry
  end
end

-- Each line's floor, for whoever starts waiting in it after everyone stopped.
for line in pairs(waiting) do
  redis.call('HSET', KEYS[1], line .. '|_v', tostring(least(line)))
end

return {redis.call('HGETALL', KEYS[1]), live}
