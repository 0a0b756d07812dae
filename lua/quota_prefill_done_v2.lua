-- tg quota v2: prefill done. The lease's request has its first token: gives its prefill
-- reservation back; its slot and tokens stay. Idempotent (a second call is a no-op).
-- KEYS[4] = released channel: "prefill" is published (long prompts of any lane may fit now).
-- ARGV: id
-- Reply: the prefill tokens given back (0: none left, or no such lease).
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then
  return 0
end
local lane, tokens, prefill = parse_lease(v)
if prefill == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[3], 'prefill:tokens', -prefill)
redis.call('HSET', KEYS[2], ARGV[1], lease_value(lane, tokens, 0))
redis.call('PUBLISH', KEYS[4], 'prefill')
return prefill
