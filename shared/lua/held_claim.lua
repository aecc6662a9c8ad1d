-- The sweeper acting on a claim by what the holder's worker main process said about it (its
-- record lives in another slot, so the sweeper reads it first and passes what it saw).
-- KEYS: run hash, leases zset, attempts hash
-- ARGV: run_id, field, holders, mode, lease_ms, fence_ms, version, reason
-- holders: the claim's holder, or for 'expire' a comma-separated list of the processes that may
--   hold it (a task received by the worker, not yet known to be accepted by one of its processes).
-- mode 'extend': the main process, alive until fence_ms, lists holder as running this work (a
--   process whose own heartbeat thread is starved, e.g. by a tool holding the GIL): extend the
--   claim by the lease, if holder still holds it, it was not expired by its worker (deadline 0:
--   the process died), and fence_ms has not passed by Redis's clock.
-- mode 'expire': the main process was last known alive until fence_ms and is dead since: expire
--   the claim now, if holder still holds it and nothing renewed it after fence_ms (a renewal made
--   later proves the holder alive: a stalled main process, not a dead worker); reason is noted as
--   the attempt's last error.
-- Returns 1 if the claim was extended or expired, else 0.
local run_id, field, holders, mode, lease_ms, fence_ms, version, reason = unpack(ARGV, 1, 8)
local run, leases, attempts_key = KEYS[1], KEYS[2], KEYS[3]

local current = redis.call('HGET', run, field)
if not current then return 0 end
local token, deadline, holder = claim_parts(current)
local now = now_ms()
if mode == 'extend' then
  if holder ~= holders or deadline <= 0 or now >= tonumber(fence_ms) then return 0 end
  local until_ms = now + tonumber(lease_ms)
  redis.call('HSET', run, field, claim_value(token, until_ms, holder))
  redis.call('ZADD', leases, 'LT', until_ms, run_id)
  return 1
end
if not listed(holders, holder) then return 0 end
if deadline == HANDED_ON then return 0 end  -- handed on already
if deadline ~= 0 and deadline - tonumber(lease_ms) > tonumber(fence_ms) then return 0 end
redis.call('HSET', run, field, claim_value(token, 0, holder))
redis.call('ZADD', leases, 'LT', now, run_id)
redis.call('HSET', attempts_key, last_error_field(version, field), reason)
return 1
