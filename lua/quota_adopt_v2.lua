-- tg quota v2: adopt. Registers leases for requests that are already running (admitted by a
-- replica's fallback while Redis was unreachable, or leases Redis lost with its data), whatever
-- the limits say: the counters then show what really runs, and new admissions wait until the
-- lanes are under their limits again.
-- ARGV: ttl_ms, then id, lane, tokens, prefill quadruples
-- Reply: how many were registered (an id already there is left as it is).
local ttl = tonumber(ARGV[1])
local now = now_ms()
local adopted = 0
for i = 2, #ARGV - 3, 4 do
  local id, lane, tokens, prefill = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    redis.call('HSET', KEYS[2], id, lease_value(lane, tokens, prefill))
    redis.call('ZADD', KEYS[1], now + ttl, id)
    redis.call('HINCRBY', KEYS[3], lane .. ':n', 1)
    redis.call('HINCRBY', KEYS[3], lane .. ':tokens', tokens)
    redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
    if prefill > 0 then
      redis.call('HINCRBY', KEYS[3], 'prefill:tokens', prefill)
    end
    adopted = adopted + 1
  end
end
return adopted
