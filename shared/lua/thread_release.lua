-- Hand a thread on from a run that ended: the first waiting run holds it now.
-- KEYS: thread state hash, waiting list. ARGV: run_id (the run that ended)
-- Returns the run that was given the thread, to wake; '' when none was (the thread is free, or
-- the run did not hold it: handed on already, a replay; a run that ended while waiting leaves the
-- queue).
local run_id = unpack(ARGV, 1, 1)
local state, waiting = KEYS[1], KEYS[2]

if (redis.call('HGET', state, F_THREAD_ACTIVE) or '') ~= run_id then
  redis.call('LREM', waiting, 0, run_id)
  return ''
end
local next_run = redis.call('LPOP', waiting)
if next_run then
  redis.call('HSET', state, F_THREAD_ACTIVE, next_run, F_THREAD_SINCE, now_ms())
  return next_run
end
redis.call('HDEL', state, F_THREAD_ACTIVE, F_THREAD_SINCE)
return ''
