-- Give a think back because its provider had no capacity: it is published again with a countdown.
-- KEYS: run hash, attempts hash, leases zset
-- ARGV: run_id, version, the claim's token, the countdown (ms), the queued lease (ms), why (JSON)
-- The claim is released and its attempt uncounted (waiting for capacity is not a crash, so it
-- never counts towards the poison limit), and the run's queued time is pushed past the countdown
-- (so the sweeper does not take a waiting think for a lost one). The run records why it waits
-- (``throttled``: the JSON given, with ``until`` in Redis ms added) and how often it did.
-- Returns the run's throttle count, or 0 if this delivery no longer holds the claim.
local run_id, version, token, wait_ms, queued_ms, why = unpack(ARGV, 1, 6)
local run, attempts_key, leases = KEYS[1], KEYS[2], KEYS[3]

local held = redis.call('HGET', run, F_RUNNING)
if not held or (claim_parts(held)) ~= token or redis.call('HGET', run, F_VERSION) ~= version then
  if redis.call('HGET', run, F_THROTTLE_OP) == token then
    return tonumber(redis.call('HGET', run, F_THROTTLES) or '1')  -- this very call, replayed
  end
  return 0
end
local now = now_ms()
local due = now + tonumber(wait_ms) + tonumber(queued_ms)
redis.call('HDEL', run, F_RUNNING)
local field = attempts_field(version, F_RUNNING)
if tonumber(redis.call('HGET', attempts_key, field) or '0') > 0 then
  redis.call('HINCRBY', attempts_key, field, -1)
end
local info = throttled_info(why, now + tonumber(wait_ms))
redis.call('HSET', run, F_QUEUED_UNTIL, due, F_QUEUED_CHECKS, '0', F_THROTTLED, info, F_THROTTLE_OP, token)
local count = redis.call('HINCRBY', run, F_THROTTLES, 1)
redis.call('ZADD', leases, due, run_id)
return count
