-- Park a run's start while its thread's previous run goes on: no worker holds it, no message waits
-- in the broker, and the sweeper does not look at it (it leaves the leases) until it is woken
-- (thread_wake.lua) by the run that ends before it, or by the sweeper's backstop.
-- KEYS: run hash, attempts hash, leases zset. ARGV: run_id, version, the claim's token, why (JSON)
-- The claim is released with its attempt uncounted (waiting is not a crash). Returns 1 if parked,
-- 0 if this delivery no longer holds the claim.
local run_id, version, token, why = unpack(ARGV, 1, 4)
local run, attempts_key, leases = KEYS[1], KEYS[2], KEYS[3]

local held = redis.call('HGET', run, F_RUNNING)
if not held or (claim_parts(held)) ~= token or redis.call('HGET', run, F_VERSION) ~= version then
  return 0
end
redis.call('HDEL', run, F_RUNNING)
local field = attempts_field(version, F_RUNNING)
if tonumber(redis.call('HGET', attempts_key, field) or '0') > 0 then
  redis.call('HINCRBY', attempts_key, field, -1)
end
redis.call('HSET', run, F_THREAD_WAIT, why)
redis.call('ZREM', leases, run_id)
return 1
