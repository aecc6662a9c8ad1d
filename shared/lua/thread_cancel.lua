-- Ask a run to stop and, if it is parked waiting for its thread (thread_park.lua), unpark it in the
-- same step, so its start (published by the caller right after) ends it INTERRUPTED at once rather
-- than when its turn comes. Unparked, the start is watched by the sweeper like any queued task: a
-- lost publish is sent again, so the cancel holds even if the caller dies right after this.
-- KEYS: run hash, leases zset. ARGV: run_id, queued_ms (how long the start may wait unclaimed)
-- Returns {phase, woken}: phase '' if the run does not exist; woken 1 if it was parked (publish its
-- start), else 0.
local run_id, queued_ms = unpack(ARGV, 1, 2)
local run, leases = KEYS[1], KEYS[2]

local phase = redis.call('HGET', run, F_PHASE)
if not phase then return {'', 0} end
if TERMINAL[phase] then return {phase, 0} end
redis.call('HSET', run, F_CANCEL, '1')
if phase ~= P_IDLE or redis.call('HEXISTS', run, F_THREAD_WAIT) == 0 then return {phase, 0} end
local due = now_ms() + tonumber(queued_ms)
redis.call('HDEL', run, F_THREAD_WAIT)
redis.call('HSET', run, F_QUEUED_UNTIL, due, F_QUEUED_CHECKS, '0')
redis.call('ZADD', leases, due, run_id)
return {phase, 1}
