-- Wake a run parked for its thread (thread_park.lua): it waits no more, and its start, published
-- by the caller right after, is watched by the sweeper like any queued task.
-- KEYS: run hash, leases zset. ARGV: run_id, queued_lease_ms
-- Returns 1 if the run was parked (publish its start), 0 if not (woken already, or not waiting).
local run_id, queued_ms = unpack(ARGV, 1, 2)
local run, leases = KEYS[1], KEYS[2]

if redis.call('HGET', run, F_PHASE) ~= P_IDLE or redis.call('HEXISTS', run, F_THREAD_WAIT) == 0 then
  return 0
end
local due = now_ms() + tonumber(queued_ms)
redis.call('HDEL', run, F_THREAD_WAIT)
redis.call('HSET', run, F_QUEUED_UNTIL, due, F_QUEUED_CHECKS, '0')
redis.call('ZADD', leases, due, run_id)
return 1
