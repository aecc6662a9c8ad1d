-- Admit a run to its conversation thread under a thread policy (docs/agents.md, "Threads and a
-- second message"), once: a replay (the start after the submit, a redelivery) reads its place.
-- KEYS: thread order list, thread state hash, waiting list, rolled-back set (one thread's slot)
-- ARGV: run_id, policy (reject, enqueue, interrupt or rollback), ttl_s
-- Returns {verdict, holder, previous, ahead...}. verdict: 'go' (the run holds the thread: it starts now),
-- 'wait' (it waits, in thread order, behind the runs ahead of it), 'busy' (policy reject and
-- another run holds the thread: the run is not admitted; holder names that run), 'ended' (it had
-- its turn already). holder: the run that held the thread when it was asked; previous: with 'wait',
-- the run just before it in the thread (the one it waits for). With interrupt or
-- rollback, ahead: every run of the thread before this one that has not ended (the holder, then
-- those waiting), which the caller asks to stop; rollback also marks them rolled back.
local run_id, policy, ttl = unpack(ARGV, 1, 3)
local order, state, waiting, rolled_back = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local holder = redis.call('HGET', state, F_THREAD_ACTIVE) or ''
local verdict
if redis.call('LPOS', order, run_id) then
  if holder == run_id then
    verdict = 'go'
  elseif redis.call('LPOS', waiting, run_id) then
    verdict = 'wait'
  else
    return {'ended', holder, ''}
  end
else
  if policy == 'reject' and holder ~= '' then return {'busy', holder, ''} end
  redis.call('RPUSH', order, run_id)
  if holder == '' then
    redis.call('HSET', state, F_THREAD_ACTIVE, run_id, F_THREAD_SINCE, now_ms())
    verdict = 'go'
  else
    redis.call('RPUSH', waiting, run_id)
    verdict = 'wait'
  end
end
local reply = {verdict, holder, ''}
if verdict == 'wait' then
  local ahead = {holder}
  for _, id in ipairs(redis.call('LRANGE', waiting, 0, -1)) do
    if id == run_id then break end
    table.insert(ahead, id)
  end
  reply[3] = ahead[#ahead]
  if policy == 'interrupt' or policy == 'rollback' then
    for _, id in ipairs(ahead) do
      table.insert(reply, id)
      if policy == 'rollback' then redis.call('SADD', rolled_back, id) end
    end
  end
end
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('EXPIRE', key, tonumber(ttl)) end
end
return reply
