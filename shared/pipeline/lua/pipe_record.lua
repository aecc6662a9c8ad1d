-- Record how item ARGV[2] of step ARGV[1] ended, once, with its event. KEYS: meta, results,
-- attempts, events. ARGV: seq, item, attempt (of the child that ended), result JSON, event JSON,
-- the stream's approximate bound.
-- Returns 'stale' (another step, or a later attempt), 'dup' (recorded already), 'ended' (recorded;
-- the pipeline ended meanwhile), 'complete' (recorded, the step's last) or 'recorded'.
local meta = KEYS[1]
if redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return 'stale' end
if (redis.call('HGET', KEYS[3], ARGV[2]) or '0') ~= ARGV[3] then return 'stale' end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[4]) == 0 then return 'dup' end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', PIPE_EVENT_FIELD, ARGV[5])
local done = redis.call('HINCRBY', meta, PIPE_DONE, 1)
if redis.call('HGET', meta, PIPE_STATUS) ~= PIPE_RUNNING then
  -- Ended, and maybe settled already: what is written now expires with the rest of it.
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
  return 'ended'
end
if done == tonumber(redis.call('HGET', meta, PIPE_TOTAL)) then return 'complete' end
return 'recorded'
