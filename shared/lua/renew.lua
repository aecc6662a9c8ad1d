-- Heartbeat: extend a live claim. KEYS: run hash, leases zset
-- Returns {held, cancel}: held is 1 while this token still owns the claim (it is then extended by
-- the lease from now, by Redis's clock); cancel is 1 once the run was asked to stop. With extend
-- '0' the claim is only checked, not extended (a tool past its deadline is left to expire).
local run_id, field, token, lease_ms, extend = unpack(ARGV, 1, 5)
local run, leases = KEYS[1], KEYS[2]

local cancel = redis.call('HGET', run, F_CANCEL) == '1' and 1 or 0
local current = redis.call('HGET', run, field)
if not current then return {0, cancel} end
local held_by, _, holder = claim_parts(current)
if held_by ~= token then return {0, cancel} end
if extend == '1' then
  local deadline = now_ms() + tonumber(lease_ms)
  -- HDEL first: at maxmemory (noeviction) Redis refuses a script whose first write may add data
  -- (HSET) but lets it go on once it wrote, and a renewal only rewrites a value of the same size.
  -- So claims stay held while Redis is full, and the work under them waits rather than being
  -- handed on.
  redis.call('HDEL', run, field)
  redis.call('HSET', run, field, claim_value(token, deadline, holder))
  redis.call('ZADD', leases, 'LT', deadline, run_id)
end
return {1, cancel}
