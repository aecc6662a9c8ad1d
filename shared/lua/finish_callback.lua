-- The end of one attempt to deliver an ended run's callback. KEYS: run hash, leases zset
-- outcome 'delivered' or 'gave_up': record it; the sweeper stops watching the run.
-- outcome 'retry': the next attempt is due in next_ms; the sweeper looks after that, in case the
--   message carrying it is lost.
-- Returns 1, or 0 if this delivery no longer holds the claim (taken over: it records nothing).
local run_id, token, outcome, state, next_ms, queued_lease_ms = unpack(ARGV, 1, 6)
local run, leases = KEYS[1], KEYS[2]
local held = redis.call('HGET', run, F_RUNNING)
if not held or (claim_parts(held)) ~= token then return 0 end
redis.call('HDEL', run, F_RUNNING)
redis.call('HSET', run, F_CALLBACK_STATE, state)
if outcome == 'retry' then
  local queued_until = now_ms() + tonumber(next_ms) + tonumber(queued_lease_ms)
  redis.call('HSET', run, F_QUEUED_UNTIL, queued_until, F_QUEUED_CHECKS, '0', F_OUTBOX_CLAIMED, '0')
  redis.call('ZADD', leases, queued_until, run_id)
else
  redis.call('HSET', run, F_CALLBACK, outcome)
  redis.call('ZREM', leases, run_id)
end
return 1
