-- Move a running pipeline from step ARGV[1] (done, or -1: not started) to step ARGV[2], once.
-- KEYS: meta, steps, items (of the new step). ARGV: from_seq, new_seq, target, index, kind, cap,
-- total, step JSON, updated_ms, then the items' input texts in item order.
-- Returns 'ok', or 'stale' (another delivery moved it on, or it ended).
local meta = KEYS[1]
if redis.call('HGET', meta, 'status') ~= 'running' then return 'stale' end
if redis.call('HGET', meta, 'seq') ~= ARGV[1] then return 'stale' end
if tonumber(ARGV[1]) >= 0 and redis.call('HGET', meta, 'done') ~= redis.call('HGET', meta, 'total') then
  return 'stale'
end
redis.call('HSET', meta, 'seq', ARGV[2], 'target', ARGV[3], 'index', ARGV[4], 'kind', ARGV[5],
  'cap', ARGV[6], 'total', ARGV[7], 'started', '0', 'done', '0', 'updated_ms', ARGV[9])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[8])
local batch = {}
for i = 10, #ARGV do
  batch[#batch + 1] = tostring(i - 10)
  batch[#batch + 1] = ARGV[i]
  if #batch >= 1000 then redis.call('HSET', KEYS[3], unpack(batch)) batch = {} end
end
if #batch > 0 then redis.call('HSET', KEYS[3], unpack(batch)) end
return 'ok'
