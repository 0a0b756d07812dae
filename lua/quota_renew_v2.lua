-- tg quota v2: renew. Extends the leases a replica holds (its heartbeat), after reaping.
-- ARGV: ttl_ms, id...
-- Reply: { renewed, reaped, missing... }: the ids that no longer exist (expired or lost).
local ttl = tonumber(ARGV[1])
local now = now_ms()
local reaped = reap(now)
local reply = { 0, reaped }
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
    reply[1] = reply[1] + 1
  else
    table.insert(reply, ARGV[i])
  end
end
return reply
