-- Create an eval once. KEYS: meta, cases, pending, active, index, its tenant's index.
-- ARGV: eval_id, created_ms, n_cases, n_items, then meta field/value pairs, then n_cases case
-- JSONs (in case order), then n_items work items (in run order). 'exists' if the eval exists.
local eval_id, created_ms = ARGV[1], tonumber(ARGV[2])
local n_cases, n_items = tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
local n_meta = #ARGV - 4 - n_cases - n_items
for i = 5, 4 + n_meta, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local first_case = 5 + n_meta
for i = 0, n_cases - 1 do redis.call('HSET', KEYS[2], tostring(i), ARGV[first_case + i]) end
local first_item = first_case + n_cases
local batch = {}
for i = first_item, first_item + n_items - 1 do
  batch[#batch + 1] = ARGV[i]
  if #batch == 1000 then redis.call('RPUSH', KEYS[3], unpack(batch)) batch = {} end
end
if #batch > 0 then redis.call('RPUSH', KEYS[3], unpack(batch)) end
redis.call('SADD', KEYS[4], eval_id)
redis.call('ZADD', KEYS[5], created_ms, eval_id)
redis.call('ZADD', KEYS[6], created_ms, eval_id)
return 'created'
