-- Move a running pipeline from step ARGV[1] (done, or -1: not started) to step ARGV[2], once.
-- KEYS: meta, steps, items (of the new step). ARGV: from_seq, new_seq, target, index, kind, cap,
-- total, step JSON, updated_ms, then the items' input texts in item order.
-- Returns 'ok', or 'stale' (another delivery moved it on, or it ended).
local meta = KEYS[1]
if redis.call('HGET', meta, PIPE_STATUS) ~= PIPE_RUNNING then return 'stale' end
if redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return 'stale' end
if tonumber(ARGV[1]) >= 0 and redis.call('HGET', meta, PIPE_DONE) ~= redis.call('HGET', meta, PIPE_TOTAL) then
  return 'stale'
end
redis.call('HSET', meta, PIPE_SEQ, ARGV[2], PIPE_TARGET, ARGV[3], PIPE_INDEX, ARGV[4], PIPE_KIND, ARGV[5],
  PIPE_CAP, ARGV[6], PIPE_TOTAL, ARGV[7], PIPE_STARTED, '0', PIPE_DONE, '0', PIPE_UPDATED_MS, ARGV[9])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[8])
local batch = {}
for i = 10, #ARGV do
  batch[#batch + 1] = tostring(i - 10)
  batch[#batch + 1] = ARGV[i]
  if #batch >= 1000 then redis.call('HSET', KEYS[3], unpack(batch)) batch = {} end
end
if #batch > 0 then redis.call('HSET', KEYS[3], unpack(batch)) end
return 'ok'
