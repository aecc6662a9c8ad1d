-- Pause or resume a schedule. A paused schedule leaves the due set (no scheduler fires it); a
-- resumed one fires again from next_tick, which also fences off a tick fired when it was paused.
-- A tick whose decision was recorded before the pause (a scheduler may be submitting its run right
-- now, or died doing it) stays the next one: it is fired to its end, entry included, and its
-- advance moves on to next_tick (SCHED_AFTER), past the ticks of the pause.
-- KEYS: the schedule's hash, the due set
-- Returns 'ok', or 'missing' when there is no such schedule (nothing is written then).
local schedule, due = KEYS[1], KEYS[2]
local mode, member, next_tick = unpack(ARGV, 1, 3)
if redis.call('HEXISTS', schedule, SCHED_SPEC) == 0 then return 'missing' end
-- Either way fields are set: at a full Redis a resume (whose first write removes the pause) is
-- refused before it writes, as a pause is.
refuse_when_full(due)
if mode == 'pause' then
  redis.call('HSET', schedule, SCHED_PAUSED, SCHED_YES)
  redis.call('ZREM', due, member)
  return 'ok'
end
redis.call('HDEL', schedule, SCHED_PAUSED)
local current = redis.call('HGET', schedule, SCHED_NEXT)
if current and redis.call('HEXISTS', schedule, SCHED_DECISION_PREFIX .. current) == 1 then
  redis.call('HSET', schedule, SCHED_AFTER, next_tick)
  next_tick = current
end
redis.call('HSET', schedule, SCHED_NEXT, next_tick)
if next_tick == SCHED_ENDED then
  redis.call('ZREM', due, member)
else
  redis.call('ZADD', due, tonumber(next_tick), member)
end
return 'ok'
