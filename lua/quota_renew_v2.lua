-- tg quota v2: renew. Extends the leases a replica holds (its heartbeat), after reaping.
-- Writes <prefix>:{quota}:beat (STRING, the Redis time in ms of the latest beat of any replica).
-- ARGV: ttl_ms, id...
-- Reply: { renewed, reaped, missing... }: the ids that no longer exist (expired or lost).
local ttl = tonumber(ARGV[1])
local now = now_ms()
-- A write first, whatever is held: a heartbeat that renews nothing must still prove that Redis
-- takes writes (a Redis out of memory under noeviction, or a read-only replica after a bad
-- failover, refuses this SET and the replica stays on its fallback; without it an empty renewal
-- succeeded there and the replica flapped between its fallback and a Redis refusing every
-- acquire).
redis.call('SET', base_key(':beat'), now)
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
