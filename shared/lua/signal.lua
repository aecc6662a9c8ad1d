-- Take a signal (a message or a state update) into a run's inbox: numbered, once per client key.
-- KEYS: run hash, inbox hash, events stream
-- ARGV: key (the client key, '' for none), digest (of the body, to tell a reused key), the signal's
--       JSON and its SignalReceived event's JSON each cut where its sequence number goes (a head
--       and a tail: the number is given here), size (bytes of the body), the run's limits on
--       signals and bytes, events_maxlen
-- A duplicate key answers the signal it named, even once the run has ended; an ended run takes
-- no new signal. Nothing is written unless the signal is taken.
-- Returns {'stored', seq, phase}, {'duplicate', seq, phase}, {'conflict', seq}, {'ended', phase},
-- {'full', limit} or {'missing'}.
local key, digest, record_head, record_tail, event_head, event_tail, size, max_count, max_bytes,
  events_maxlen = unpack(ARGV, 1, 10)
local run, inbox, events_key = KEYS[1], KEYS[2], KEYS[3]

local phase = redis.call('HGET', run, F_PHASE)
if not phase then return {'missing'} end
if key ~= '' then
  local known = redis.call('HGET', inbox, INBOX_KEY_PREFIX .. key)
  if known then
    if redis.call('HGET', inbox, INBOX_DIGEST_PREFIX .. known) ~= digest then return {'conflict', known} end
    return {'duplicate', known, phase}
  end
end
if TERMINAL[phase] then return {'ended', phase} end
local counts = redis.call('HMGET', inbox, INBOX_NEXT, INBOX_BYTES)
if tonumber(counts[1] or '0') >= tonumber(max_count) then return {'full', max_count} end
if tonumber(counts[2] or '0') + tonumber(size) > tonumber(max_bytes) then return {'full', max_bytes} end
local seq = redis.call('HINCRBY', inbox, INBOX_NEXT, 1)
redis.call('HINCRBY', inbox, INBOX_BYTES, size)
redis.call('HSET', inbox, INBOX_SIGNAL_PREFIX .. seq, record_head .. seq .. record_tail)
if key ~= '' then
  redis.call('HSET', inbox, INBOX_KEY_PREFIX .. key, seq, INBOX_DIGEST_PREFIX .. seq, digest)
end
redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, event_head .. seq .. event_tail)
return {'stored', tostring(seq), phase}
