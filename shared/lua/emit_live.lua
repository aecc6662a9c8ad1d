-- Append live events (a step's token deltas, a notice of voided custom events), only while the run
-- has not ended, at the step they belong to when one is given, and while the delivery streaming
-- them still holds the run's phase claim when its token is given: nothing follows a run's end
-- event (a stream ends there), and the text of a model call that lost its run (cancelled, taken
-- over, moved on, even within its step) does not land in the run's stream.
-- KEYS: run hash, events stream
-- ARGV: step ('' for any), events_maxlen, claim token ('' for none), then each event's JSON
-- Returns how many events were appended: all of them, or 0.
local step, events_maxlen, token = ARGV[1], ARGV[2], ARGV[3]
local run, events_key = KEYS[1], KEYS[2]
local state = redis.call('HMGET', run, F_PHASE, F_STEP, F_RUNNING)
if not state[1] or TERMINAL[state[1]] or (step ~= '' and state[2] ~= step) then return 0 end
if token ~= '' and (not state[3] or (claim_parts(state[3])) ~= token) then return 0 end
for at = 4, #ARGV do
  redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, ARGV[at])
end
return #ARGV - 3
