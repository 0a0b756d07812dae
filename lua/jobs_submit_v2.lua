-- tg jobs v2: submit. Queues a job when the store, and its tenant's part of it, have room.
-- ARGV: base, id, tenant ("" = none), share, max_jobs, max_bytes, bytes, max_jobs_per_tenant,
--   max_bytes_per_tenant, field, value, ...
--   bytes: what the job keeps (its request), counted against max_bytes; field/value: the
--   job's record (request, classification, notify URL, traceparent...). A tenant's live jobs
--   and bytes are the meta fields tj:<tenant> and tb:<tenant> (kept by submit, end, beat and
--   cancel, whose drop of an ended job's result gives them back as the beat's expiry does).
-- Reply: { 1 } queued, { 0 } the store is full (max_jobs live jobs, or max_bytes), { -1 } the
--   id exists (checked first: a submit asked again after its reply was lost learns it queued), { -2, held } the tenant keeps max_jobs_per_tenant jobs, { -3, held } its jobs
--   keep max_bytes_per_tenant bytes.
local base, id, tenant = ARGV[1], ARGV[2], ARGV[3]
local share, max_jobs = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_bytes, bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local tenant_jobs, tenant_bytes = tonumber(ARGV[8]), tonumber(ARGV[9])
-- First: a submit asked again after its reply was lost finds its job, whatever room is left.
if redis.call('EXISTS', KEYS[11]) == 1 then
  return { -1 }
end
if tenant ~= '' then
  local held = math.max(0, meta_number('tj:' .. tenant))
  if held + 1 > tenant_jobs then
    return { -2, held }
  end
  local kept = math.max(0, meta_number('tb:' .. tenant))
  if kept + bytes > tenant_bytes then
    return { -3, kept }
  end
end
local live = 0
for _, s in ipairs({ 'queued', 'running', 'done', 'failed', 'cancelled' }) do
  live = live + meta_number('n:' .. s)
end
if live + 1 > max_jobs or meta_number('bytes') + bytes > max_bytes then
  return { 0 }
end
-- Start-time fair queuing: the job's start tag is its tenant's last finish tag or the virtual
-- time, whichever is later; its finish tag is that plus 1 / share.
local start = math.max(meta_number('vtime'), meta_number('t:' .. tenant))
local tag = tostring(start)
redis.call('HSET', KEYS[10], 't:' .. tenant, tostring(start + 1 / math.max(share, 0.001)))
redis.call('ZADD', KEYS[7], tag, id)
local now = now_ms()
redis.call('HSET', KEYS[11], 'status', 'queued', 'submitted_ms', now, 'attempt', 0,
  'tag', tag, 'tenant', tenant, 'bytes', bytes)
for i = 10, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[11], ARGV[i], ARGV[i + 1])
end
redis.call('HINCRBY', KEYS[10], 'bytes', bytes)
if tenant ~= '' then
  redis.call('HINCRBY', KEYS[10], 'tj:' .. tenant, 1)
  redis.call('HINCRBY', KEYS[10], 'tb:' .. tenant, bytes)
end
recount(nil, 'queued')
announce(base, id)
return { 1 }
