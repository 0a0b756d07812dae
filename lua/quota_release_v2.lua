-- tg quota v2: release. Gives a lease back; idempotent (a second call is a no-op).
-- KEYS[4] = <prefix>:{quota}:released  pub/sub channel; the lane name is published on release,
--   and "prefill" too when the lease still held prefill room (its request ended in prefill).
-- ARGV: id
-- Reply: 1 when the lease was held, 0 when it was already gone.
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then
  return 0
end
local lane, tokens, prefill = parse_lease(v)
give_back(lane, tokens, prefill)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', KEYS[4], lane)
if prefill > 0 then
  redis.call('PUBLISH', KEYS[4], 'prefill')
end
return 1
