-- Read a batch of ended runs of one shard whole, for the archiver: one call instead of five
-- commands a run (every key of a shard shares its hash tag, so the batch is one slot).
-- KEYS: for each run: its hash, messages list, checkpoints list, events stream
-- Returns, for each run in order, one of
--   {}           its keys are gone (they expired before it was archived);
--   {'later'}    not ended, or its completion callback is still being delivered;
--   {body, request, epoch, created, callback_state, messages, checkpoints, events}
--                the head's fields as stored (created and callback_state may be false: absent),
--                the two lists whole, the events as stream id, event JSON (false: none), ...
local replies = {}
for i = 1, #KEYS, 4 do
  local head = redis.call('HMGET', KEYS[i], F_BODY, F_REQUEST, F_EPOCH, F_CREATED, F_CALLBACK_STATE,
    F_PHASE, F_CALLBACK)
  if not head[1] then
    replies[#replies + 1] = {}
  elseif not TERMINAL[head[6]] or head[7] == CALLBACK_PENDING then
    replies[#replies + 1] = {'later'}
  else
    local events = {}
    for _, entry in ipairs(redis.call('XRANGE', KEYS[i + 3], '0', '+')) do
      local fields, event = entry[2], false
      for f = 1, #fields, 2 do
        if fields[f] == EVENT_FIELD then event = fields[f + 1] end
      end
      events[#events + 1] = entry[1]
      events[#events + 1] = event
    end
    replies[#replies + 1] = {head[1], head[2], head[3], head[4], head[5],
      redis.call('LRANGE', KEYS[i + 1], 0, -1), redis.call('LRANGE', KEYS[i + 2], 0, -1), events}
  end
end
return replies
