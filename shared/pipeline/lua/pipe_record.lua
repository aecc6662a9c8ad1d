-- Record how item ARGV[2] of step ARGV[1] ended, once, with its event; then, when items of the step
-- wait to start, take the step's pump lease and the items the room allows, for the caller to start.
-- KEYS: meta, results, attempts, events, children, the step's items, its pump lease. ARGV: seq,
-- item, attempt (of the child that ended), result JSON, event JSON, the stream's approximate bound,
-- the child run's id and its child_started event JSON (both empty: the item had no child run), the
-- pipeline run's creation time as the caller knows it (empty: the caller read the meta just now),
-- how many items to take at most (0: none, nor the lease), the caller's lease token and the
-- lease's length in ms. A child whose creator died between creating it and noting it (pipe_mark)
-- is noted here, with its event, so its start is in the stream once.
-- Returns {answer, then pipe_take's reply when the answer is 'recorded'}. The answer: 'unknown'
-- (no pipeline run of that creation time has this id: the caller's knowledge is out of date),
-- 'stale' (another step, or a later attempt), 'dup' (recorded already), 'ended' (recorded; the
-- pipeline ended meanwhile), 'complete' (recorded, the step's last), 'waiting' (recorded; every
-- item is started, so there is nothing to start in the room it gave back), 'pumping' (recorded;
-- another holds the step's pump lease, and takes the room before giving the lease up: pipe_mark),
-- or 'recorded' (recorded, and the step has items not started yet; with ARGV[10] > 0 the caller
-- now holds the lease, which pipe_mark gives up once no room is left, else the items it took).
local meta = KEYS[1]
if ARGV[9] ~= '' and redis.call('HGET', meta, PIPE_CREATED_AT) ~= ARGV[9] then return {'unknown'} end
if redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return {'stale'} end
if (redis.call('HGET', KEYS[3], ARGV[2]) or '0') ~= ARGV[3] then return {'stale'} end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[4]) == 0 then return {'dup'} end
if ARGV[7] ~= '' and redis.call('HGET', KEYS[5], ARGV[2]) ~= ARGV[7] then
  redis.call('HSET', KEYS[5], ARGV[2], ARGV[7])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', PIPE_EVENT_FIELD, ARGV[8])
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', PIPE_EVENT_FIELD, ARGV[5])
local done = redis.call('HINCRBY', meta, PIPE_DONE, 1)
if redis.call('HGET', meta, PIPE_STATUS) ~= PIPE_RUNNING then
  -- Ended, and maybe settled already: what is written now expires with the rest of it.
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[5], ttl)
  end
  return {'ended'}
end
local total = tonumber(redis.call('HGET', meta, PIPE_TOTAL))
if done == total then return {'complete'} end
if tonumber(redis.call('HGET', meta, PIPE_STARTED)) >= total then return {'waiting'} end
if ARGV[10] == '0' then return {'recorded'} end
-- The lease's holder takes this room too: it takes items again before it gives the lease up.
if not redis.call('SET', KEYS[7], ARGV[11], 'NX', 'PX', ARGV[12]) then return {'pumping'} end
local taken = pipe_take(meta, KEYS[6], KEYS[3], ARGV[1], tonumber(ARGV[10]))
if taken[2] == 0 then redis.call('DEL', KEYS[7]) end
return {'recorded', unpack(taken)}
