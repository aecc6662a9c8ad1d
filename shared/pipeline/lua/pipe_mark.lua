-- Note that each child run named exists (item ARGV[2], run id ARGV[3], its event ARGV[4] JSON,
-- then the next child's three) and add its event to the stream, the first time only: one call for
-- the children a pump created in one batch. KEYS: children, events, meta. ARGV[1]: the stream's
-- approximate bound. Returns {the pipeline run's status (false: it has none, it expired), for each
-- child 1 the first time or 0 if it was noted already}, the status read once the children are
-- noted: a run still running then has them among those its end's cascade cancels.
local status = redis.call('HGET', KEYS[3], PIPE_STATUS)
local noted = {}
local any = false
for i = 2, #ARGV, 3 do
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
return {status, noted}
