-- tg quota v2: prefill done. The leases' requests have their first tokens: gives their prefill
-- reservations back; their slots and tokens stay. Idempotent (a second call is a no-op).
-- KEYS[4] = released channel: "prefill" is published once when room came back (long prompts
--   of any lane may fit now).
-- ARGV: id, age, id, age, ... (a replica's releaser sends what piled up since its last call in
--   one call). age: the milliseconds since the request's first token came, measured on the
--   replica (the call may have waited behind another, or been retried after one failed);
--   "-" when unknown (a lease registered again after its first token): no rate is learnt.
-- Reply: the prefill tokens given back (0: none left, or no such leases).
local given = 0
for i = 1, #ARGV - 1, 2 do
  local id, age = ARGV[i], tonumber(ARGV[i + 1])
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    local lane, tokens, prefill = parse_lease(v)
    if prefill > 0 then
      local since = age and string.find(lane, '@', 1, true)
        and redis.call('ZSCORE', base_key(':borrowers'), id)
      if since then
        -- A borrower's first token: the prefill rate its grace is estimated at (jobs.preempt),
        -- timed from its borrow to its first token (not to this call).
        local took = now_ms() - age - tonumber(since)
        if took > 0 then
          redis.call('HSET', base_key(':preempt'), 'rate', math.floor(prefill * 1000 / took))
        end
      end
      redis.call('HINCRBY', KEYS[3], 'prefill:tokens', -prefill)
      redis.call('HSET', KEYS[2], id, lease_value(lane, tokens, 0))
      given = given + prefill
    end
  end
end
if given > 0 then
  redis.call('PUBLISH', KEYS[4], 'prefill')
end
return given
