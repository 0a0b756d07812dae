-- Fairness across the fleet (`src/admission/redis/service.rs`): one replica's heartbeat.
-- KEYS[1]: HASH of each tenant's service, tokens over its share (field: 16 hex of a hash of
--          the tenant's name); field `_v`: the least counter among the tenants waiting
--          anywhere, the last time any waited.
-- KEYS[2]: HASH of who waits where: field `<line>|<replica>|<tenant field>` (`<line>|<tenant
--          field>` from replicas of before the replica was named), value: until when (ms of
--          Redis server time) the entry counts; expired entries are dropped here, and so are
--          this replica's own that this call does not write again (its tenants that stopped
--          waiting), and an entry counting past now + ARGV[1] (written before the clock was set
--          back) is brought back to that.
-- ARGV[1]: how long this call's entries count (ms).
-- ARGV[2]: this replica's name.
-- ARGV[3..]: `<line>|<replica>|<tenant field>` for each tenant waiting in each of this
--          replica's lines.
-- A tenant that starts waiting (no entry counts for it anywhere) is lifted to the least
-- counter among the tenants already waiting (or to `_v` when none waits): service it
-- received while nobody else waited is no debt, and idle time banks no credit.
-- Replies {counters as HGETALL, the entries that count (this call's included)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])

local function tenant_of(entry)
  return string.match(entry, '([^|]+)$')
end
local function counter(tenant)
  return tonumber(redis.call('HGET', KEYS[1], tenant) or '0')
end

local mine = {}
for i = 3, #ARGV do
  mine[ARGV[i]] = true
end
local own = '|' .. ARGV[2] .. '|'

local live, waiting = {}, {}
local entries = redis.call('HGETALL', KEYS[2])
for i = 1, #entries, 2 do
  local entry, until_ms = entries[i], tonumber(entries[i + 1])
  local stale = string.find(entry, own, 1, true) ~= nil and not mine[entry]
  if until_ms < now or stale then
    redis.call('HDEL', KEYS[2], entry)
  else
    if until_ms > now + ttl then
      redis.call('HSET', KEYS[2], entry, now + ttl)
    end
    live[#live + 1] = entry
    waiting[tenant_of(entry)] = true
  end
end

-- The least counter among the tenants waiting (nil when none waits).
local function least_waiting()
  local low = nil
  for tenant in pairs(waiting) do
    local c = counter(tenant)
    if low == nil or c < low then
      low = c
    end
  end
  return low
end

local least = least_waiting() or tonumber(redis.call('HGET', KEYS[1], '_v') or '0')

for i = 3, #ARGV do
  local entry = ARGV[i]
  local tenant = tenant_of(entry)
  if not waiting[tenant] then
    if counter(tenant) < least then
      redis.call('HSET', KEYS[1], tenant, tostring(least))
    end
    waiting[tenant] = true
  end
  if redis.call('HSET', KEYS[2], entry, now + ttl) == 1 then
    live[#live + 1] = entry
  end
end

-- The floor for whoever starts waiting after everyone stopped.
local floor = least_waiting()
if floor ~= nil then
  redis.call('HSET', KEYS[1], '_v', tostring(floor))
end

return {redis.call('HGETALL', KEYS[1]), live}
