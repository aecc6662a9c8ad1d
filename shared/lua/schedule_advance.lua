-- Move a schedule on from the tick it was at (compare-and-set) and record what the tick came to:
-- of the schedulers that fire one tick, one advances it and writes its history entry.
-- KEYS: the schedule's hash, its history list, the due set
-- Returns 1 when advanced, 0 when the schedule was not at that tick (or is gone).
local schedule, history, due = KEYS[1], KEYS[2], KEYS[3]
local tick, next_tick, entry, counter, count, run_id, member, history_max = unpack(ARGV, 1, 8)
if redis.call('HGET', schedule, SCHED_NEXT) ~= tick then return 0 end
redis.call('HSET', schedule, SCHED_NEXT, next_tick)
redis.call('HDEL', schedule, SCHED_DECISION_PREFIX .. tick)
redis.call('HINCRBY', schedule, counter, tonumber(count))
if run_id ~= '' then redis.call('HSET', schedule, SCHED_LAST_RUN, run_id) end
redis.call('RPUSH', history, entry)
while redis.call('LLEN', history) > tonumber(history_max) do redis.call('LPOP', history) end
if redis.call('HGET', schedule, SCHED_PAUSED) ~= SCHED_YES then
  redis.call('ZADD', due, tonumber(next_tick), member)
end
return 1
