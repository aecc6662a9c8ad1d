-- Note that each child run named exists (item, run id, its event JSON, from ARGV[7] on, three per
-- child) and add its event to the stream, the first time only: one call for the children a pump
-- created in one batch. KEYS: children, events, meta, the step's items, attempts, its pump lease.
-- ARGV: the stream's approximate bound, the step, then for a holder of the step's pump lease: how
-- many items to take at most, its token ('': none held), the lease's length in ms, and '1' when it
-- would hand the lease on.
-- The holder then takes the items the room allows now (pipe_take) and keeps the lease, or gives
-- it up when none is left: so room given back while it held the lease (a record answered
-- 'pumping') is taken by it. Handing on ('1'), it gives the lease up while a child of the step is
-- live, whose record takes the lease and the room; with none live it goes on taking.
-- Returns {the pipeline run's status (false: it has none, it expired), for each child 1 the first
-- time or 0 if it was noted already, pipe_take's reply ({0, 0}: nothing taken)}, the status read
-- once the children are noted: a run still running then has them among those its end's cascade
-- cancels.
local status = redis.call('HGET', KEYS[3], PIPE_STATUS)
local noted = {}
local any = false
for i = 7, #ARGV, 3 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    noted[#noted + 1] = 0
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', PIPE_EVENT_FIELD, ARGV[i + 2])
    noted[#noted + 1] = 1
    any = true
  end
end
if any then
  -- Noted after the pipeline run ended and settled: they expire with the rest of it.
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
end
local taken = {0, 0}
if ARGV[4] ~= '' and redis.call('GET', KEYS[6]) == ARGV[4] then
  local counts = redis.call('HMGET', KEYS[3], PIPE_STARTED, PIPE_DONE)
  if ARGV[6] ~= '1' or counts[1] == counts[2] then
    taken = pipe_take(KEYS[3], KEYS[4], KEYS[5], ARGV[2], tonumber(ARGV[3]))
  end
  if taken[2] == 0 then
    redis.call('DEL', KEYS[6])
  else
    redis.call('PEXPIRE', KEYS[6], ARGV[5])
  end
end
return {status, noted, taken}
