-- tg quota v2: release. Gives leases back; idempotent (a second call is a no-op).
-- KEYS[4] = <prefix>:{quota}:released  pub/sub channel; each lane that got a lease back is
--   published once per call, and "prefill" once when a lease still held prefill room (its
--   request ended in prefill).
-- ARGV: id, ... (a replica's releaser sends what piled up since its last call in one call)
-- Reply: how many of them were held (the others were already gone).
local released, lanes, prefilled = 0, {}, false
for _, id in ipairs(ARGV) do
  local lane, prefill, budget = drop_lease(id)
  if lane then
    released = released + 1
    lanes[lane] = true
    lanes[budget] = true
    prefilled = prefilled or prefill > 0
  end
end
for _, lane in ipairs(LANES) do
  if lanes[lane] then
    redis.call('PUBLISH', KEYS[4], lane)
  end
end
if prefilled then
  redis.call('PUBLISH', KEYS[4], 'prefill')
end
return released
