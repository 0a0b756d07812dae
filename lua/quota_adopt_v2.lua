-- tg quota v2: adopt. Registers leases for requests that are already running (admitted by a
-- replica's fallback while Redis was unreachable, or leases Redis lost with its data), whatever
-- the limits say: the counters then show what really runs, and new admissions wait until the
-- lanes are under their limits again.
-- ARGV: ttl_ms, then id, lane, tokens, prefill quadruples; a pre-emptible lease's lane is its
--   `<seat>@<budget>` field, and it is a borrower again (one that Redis lost stayed out of
--   `:borrowers`, so no refused acquire could ask it to leave: it held its seat to the end).
-- Reply: how many were registered (an id already there is left as it is).
local ttl = tonumber(ARGV[1])
local now = now_ms()
local adopted = 0
for i = 2, #ARGV - 3, 4 do
  local id, lane, tokens, prefill = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    put_lease(now, ttl, id, lane, tokens, prefill)
    if string.find(lane, '@', 1, true) then
      redis.call('ZADD', base_key(':borrowers'), now, id)
    end
    adopted = adopted + 1
  end
end
return adopted
