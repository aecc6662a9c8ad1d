-- Take up to ARGV[3] work items for case runs, within the eval's cap and budget.
-- KEYS: meta, pending, slots, counts, active. ARGV: cap, lease_ms, want, max_tokens (0: none),
-- max_cost_micro (0: none), eval_id. Each item taken holds a slot leased until now + lease_ms; the caller
-- creates its run and then binds the slot (score inf) until the result is recorded. A slot whose
-- lease expires unbound belonged to a caller that died: the sweeper finishes its work.
-- Returns {'ok', item...} | {'stopped'} | {'full'} | {'empty'} | {'budget'}.
local cap, lease_ms, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_tokens, max_cost = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('HGET', KEYS[1], EVAL_STATUS) ~= EVAL_RUNNING then return {'stopped'} end
local used_tokens = tonumber(redis.call('HGET', KEYS[4], EVAL_TOKENS) or '0')
local used_cost = tonumber(redis.call('HGET', KEYS[4], EVAL_COST_MICRO) or '0')
if (max_tokens > 0 and used_tokens >= max_tokens) or (max_cost > 0 and used_cost >= max_cost) then
  redis.call('HSET', KEYS[1], EVAL_STATUS, EVAL_BUDGET_EXHAUSTED)
  if redis.call('ZCARD', KEYS[3]) == 0 then redis.call('SREM', KEYS[5], ARGV[6]) end
  return {'budget'}
end
local free = cap - redis.call('ZCARD', KEYS[3])
if free <= 0 then return {'full'} end
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease_ms
local taken = {'ok'}
for _ = 1, math.min(free, want) do
  local item = redis.call('LPOP', KEYS[2])
  if not item then break end
  redis.call('ZADD', KEYS[3], deadline, item)
  taken[#taken + 1] = item
end
if #taken == 1 then return {'empty'} end
return taken
