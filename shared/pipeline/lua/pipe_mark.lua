-- Note that item ARGV[1]'s child run ARGV[2] exists, and add its event (ARGV[3], JSON) to the
-- stream, the first time only. KEYS: children, events, meta. ARGV[4]: the stream's approximate
-- bound. Returns {1 the first time or 0 if it was noted already, the pipeline run's status (false:
-- it has none, it expired)}, the status read once the child is noted: a run still running then
-- has the child among those its end's cascade cancels.
local status = redis.call('HGET', KEYS[3], PIPE_STATUS)
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return {0, status} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', PIPE_EVENT_FIELD, ARGV[3])
-- Noted after the pipeline run ended and settled: it expires with the rest of it.
local ttl = redis.call('PTTL', KEYS[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, status}
