-- Change a schedule's spec, if it is still the one the caller read (two updates never lose one
-- another's change), and with a new timing or end date its next tick. A tick in flight (its
-- decision recorded: a scheduler may be submitting its run) stays the next one and keeps what it
-- was decided with; the new next tick is left in SCHED_AFTER for its advance.
-- KEYS: the schedule's hash, the due set
-- ARGV: the spec read, the new spec, the new next tick ('' keeps it; SCHED_ENDED: fires no more),
-- the schedule's due set member
-- Returns 'ok', 'conflict' (changed since it was read) or 'missing' (nothing is written then).
local schedule, due = KEYS[1], KEYS[2]
local expected, spec, next_tick, member = unpack(ARGV, 1, 4)
local current_spec = redis.call('HGET', schedule, SCHED_SPEC)
if not current_spec then return 'missing' end
if current_spec ~= expected then return 'conflict' end
redis.call('HSET', schedule, SCHED_SPEC, spec)
if next_tick == '' then return 'ok' end
local current = redis.call('HGET', schedule, SCHED_NEXT)
if current and redis.call('HEXISTS', schedule, SCHED_DECISION_PREFIX .. current) == 1 then
  redis.call('HSET', schedule, SCHED_AFTER, next_tick)
  return 'ok'
end
redis.call('HDEL', schedule, SCHED_AFTER)
redis.call('HSET', schedule, SCHED_NEXT, next_tick)
if next_tick == SCHED_ENDED then
  redis.call('ZREM', due, member)
elseif redis.call('HGET', schedule, SCHED_PAUSED) ~= SCHED_YES then
  redis.call('ZADD', due, tonumber(next_tick), member)
end
return 'ok'
