-- Append live events (a step's token deltas, a notice of voided custom events), only while the run
-- has not ended, and at the step they belong to when one is given: nothing follows a run's end
-- event (a stream ends there), and the text of a model call that lost its run (cancelled, taken
-- over, moved on) does not land in another step's place.
-- KEYS: run hash, events stream
-- ARGV: step ('' for any), events_maxlen, then each event's JSON
-- Returns how many events were appended: all of them, or 0.
local step, events_maxlen = ARGV[1], ARGV[2]
local run, events_key = KEYS[1], KEYS[2]
local state = redis.call('HMGET', run, F_PHASE, F_STEP)
if not state[1] or TERMINAL[state[1]] or (step ~= '' and state[2] ~= step) then return 0 end
for at = 3, #ARGV do
  redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, ARGV[at])
end
return #ARGV - 2
