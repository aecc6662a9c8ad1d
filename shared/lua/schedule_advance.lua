-- Move a schedule on from the tick it was at (compare-and-set) and record what the tick came to:
-- of the schedulers that fire one tick, one advances it and writes its history entry.
-- The caller names the decision it followed ('' for ticks passed over as missed): a tick whose
-- recorded decision is another is not advanced, so a tick whose run may be under way is never
-- passed over without its entry. A timing changed while the tick was in flight left the tick after
-- it in SCHED_AFTER, which wins over the caller's next_tick. SCHED_ENDED: no tick follows.
-- KEYS: the schedule's hash, its history list, the due set
-- Returns 1 when advanced, 0 when the schedule was not at that tick (or is gone).
local schedule, history, due = KEYS[1], KEYS[2], KEYS[3]
local tick, next_tick, entry, counter, count, run_id, member, history_max, decision = unpack(ARGV, 1, 9)
if redis.call('HGET', schedule, SCHED_NEXT) ~= tick then return 0 end
local decided = redis.call('HGET', schedule, SCHED_DECISION_PREFIX .. tick)
if (decided or '') ~= decision then return 0 end
-- The advance adds its history entry: at a full Redis it is refused before it writes, whether or
-- not its first write is the removal of SCHED_AFTER.
refuse_when_full(due)
local after = redis.call('HGET', schedule, SCHED_AFTER)
if after then
  next_tick = after
  redis.call('HDEL', schedule, SCHED_AFTER)
end
redis.call('HSET', schedule, SCHED_NEXT, next_tick)
redis.call('HDEL', schedule, SCHED_DECISION_PREFIX .. tick)
redis.call('HINCRBY', schedule, counter, tonumber(count))
if run_id ~= '' then redis.call('HSET', schedule, SCHED_LAST_RUN, run_id) end
redis.call('RPUSH', history, entry)
while redis.call('LLEN', history) > tonumber(history_max) do redis.call('LPOP', history) end
if next_tick == SCHED_ENDED then
  redis.call('ZREM', due, member)
elseif redis.call('HGET', schedule, SCHED_PAUSED) ~= SCHED_YES then
  redis.call('ZADD', due, tonumber(next_tick), member)
end
return 1
