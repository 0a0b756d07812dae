-- A tenant's budget ledger, shared by every replica (`src/admission/tenant_budget.rs`).
-- KEYS[1]: HASH of the minute's charges, fields `r:<second>` (requests) and `t:<second>`
--          (tokens), seconds of Redis server time; fields older than 60 s are dropped here,
--          and fields after now (the clock was set back) become now's; `m:<second>` then
--          names the second that a second after now was moved to (settlements follow it),
--          kept while that one is in the minute.
-- KEYS[2]: HASH of the day: `d` (the UTC day number) and `t` (its tokens).
-- KEYS[3]: (charge, settle, cancel; optional) STRING one charge's record,
--          `<second> <day> <tokens>`, kept 120 s, or `cancelled` (120 s) once given back, or
--          `settled` (120 s) once settled.
--          Its name carries the charge's id, so a replica whose charge reply was lost can
--          give the charge back (`cancel`) without knowing whether it ran.
-- ARGV[1]: "charge", "settle", "cancel" or "peek".
-- charge: ARGV[2..4] requests per minute, tokens per minute, tokens per day (0: no limit),
--         ARGV[5] the tokens to reserve. Replies {0, second, day} when charged, or
--         {1|2|3, used, limit, retry_after_s} for the limit that refuses (1 requests per
--         minute, 2 tokens per minute, 3 tokens per day), or {4} when KEYS[3] exists (the
--         charge was cancelled before it ran, or already ran): nothing is charged.
-- settle: ARGV[2] the charge's second, ARGV[3] its day, ARGV[4] tokens to add (negative to
--         give back), ARGV[5] "1" when the request is not counted at all (it never ran).
--         Never below zero; a second that left the minute or a past day is not touched; a
--         second moved (`m:`) is settled where it went.
--         Marks KEYS[3] `settled` (120 s) in place of the charge's record, and does nothing
--         when it is marked already: a settle sent again because the reply to the first was
--         lost is applied once.
-- cancel: gives back the charge recorded in KEYS[3] (as a settle of a request that never ran)
--         and leaves `cancelled` there, so that the charge, if still on its way, does nothing.
--         Replies 1 when a charge was given back, else 0.
-- peek:   replies {requests, tokens} of the last minute and the day's tokens.
local mode = ARGV[1]
-- The second a charge stamped `second` counts in: its own, or where it was moved (each move
-- goes to an earlier second); nil when it left the minute.
local function counted_in(second)
  for _ = 1, 8 do
    if redis.call('HEXISTS', KEYS[1], 't:' .. second) == 1 then
      return second
    end
    second = redis.call('HGET', KEYS[1], 'm:' .. second)
    if not second then
      return nil
    end
  end
  return nil
end
local function settle(second, day, delta, uncounted)
  second = counted_in(second)
  if second then
    local f = 't:' .. second
    if redis.call('HINCRBY', KEYS[1], f, delta) < 0 then
      redis.call('HSET', KEYS[1], f, 0)
    end
    if uncounted == '1' then
      local r = 'r:' .. second
      if redis.call('HINCRBY', KEYS[1], r, -1) < 0 then
        redis.call('HSET', KEYS[1], r, 0)
      end
    end
  end
  if redis.call('HGET', KEYS[2], 'd') == day then
    if redis.call('HINCRBY', KEYS[2], 't', delta) < 0 then
      redis.call('HSET', KEYS[2], 't', 0)
    end
  end
end
if mode == 'settle' then
  if KEYS[3] and redis.call('GET', KEYS[3]) == 'settled' then
    return 0
  end
  settle(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  if KEYS[3] then
    redis.call('SET', KEYS[3], 'settled', 'EX', 120)
  end
  return 0
end
if mode == 'cancel' then
  local record = redis.call('GET', KEYS[3])
  redis.call('SET', KEYS[3], 'cancelled', 'EX', 120)
  if record then
    local second, day, tokens = string.match(record, '^(%d+) (%d+) (%d+)$')
    if second then
      settle(second, day, '-' .. tokens, '1')
      return 1
    end
  end
  return 0
end
if mode == 'charge' and KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  return {4}
end

local now = tonumber(redis.call('TIME')[1])
local today = math.floor(now / 86400)
local oldest = now - 59
local fields = redis.call('HGETALL', KEYS[1])
local req, tok, seconds, seen = {}, {}, {}, {}
local n_req, n_tok = 0, 0
for i = 1, #fields, 2 do
  local kind, s = string.match(fields[i], '^(%a):(%d+)$')
  s = tonumber(s)
  if kind == 'm' then
    if (tonumber(fields[i + 1]) or 0) < oldest then
      redis.call('HDEL', KEYS[1], fields[i])
    end
  elseif s == nil or s < oldest then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    local v = tonumber(fields[i + 1]) or 0
    if s > now then
      -- Charged on a clock since set back (Redis's own, or a failover to a server whose clock
      -- is behind): counted as now's, so it leaves the minute a minute from now, not as long
      -- again as the clock went back (the tenant refused all that time), nor at once.
      redis.call('HDEL', KEYS[1], fields[i])
      redis.call('HINCRBY', KEYS[1], kind .. ':' .. now, v)
      redis.call('HSET', KEYS[1], 'm:' .. s, now)
      s = now
    end
    if kind == 'r' then
      req[s] = (req[s] or 0) + v
      n_req = n_req + v
    else
      tok[s] = (tok[s] or 0) + v
      n_tok = n_tok + v
    end
    if not seen[s] then
      seen[s] = true
      seconds[#seconds + 1] = s
    end
  end
end
local day = redis.call('HMGET', KEYS[2], 'd', 't')
local day_tokens = 0
-- A clock set back across one midnight goes on counting in the later day (`counted`): it must
-- not start a fresh one. A day further ahead (a clock that was days ahead) is not waited for.
local counted = today
local kept_day = tonumber(day[1]) or -1
if kept_day == today or kept_day == today + 1 then
  counted = kept_day
  day_tokens = tonumber(day[2]) or 0
end
if mode == 'peek' then
  return {n_req, n_tok, day_tokens}
end

table.sort(seconds)
-- Seconds until the minute's charges (by `of`) fall under `limit`.
local function wait_under(of, total, limit)
  for _, s in ipairs(seconds) do
    total = total - (of[s] or 0)
    if total < limit then
      return math.max(s + 60 - now, 1)
    end
  end
  return 1
end
local rpm, tpm, tpd = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if rpm > 0 and n_req >= rpm then
  return {1, n_req, rpm, wait_under(req, n_req, rpm)}
end
if tpm > 0 and n_tok >= tpm then
  return {2, n_tok, tpm, wait_under(tok, n_tok, tpm)}
end
if tpd > 0 and day_tokens >= tpd then
  return {3, day_tokens, tpd, (counted + 1) * 86400 - now}
end
redis.call('HINCRBY', KEYS[1], 'r:' .. now, 1)
redis.call('HINCRBY', KEYS[1], 't:' .. now, ARGV[5])
redis.call('EXPIRE', KEYS[1], 120)
if kept_day ~= counted then
  redis.call('HSET', KEYS[2], 'd', today, 't', 0)
end
redis.call('HINCRBY', KEYS[2], 't', ARGV[5])
redis.call('EXPIRE', KEYS[2], 172800)
if KEYS[3] then
  redis.call('SET', KEYS[3], now .. ' ' .. counted .. ' ' .. ARGV[5], 'EX', 120)
end
return {0, now, counted}
