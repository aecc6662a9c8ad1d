-- Append a tool's custom event, only while the delivery that emits it still holds the call.
-- KEYS: run hash, results hash of the step, events stream
-- Appended (returns 1) when the call's claim holds claim_token and was not handed on, and the call
-- has no result yet; otherwise returns 0 and appends nothing: the delivery was fenced off (another
-- took the call over, or the sweeper handed it on), or the call is over, so nothing of it can
-- follow its ToolCompleted.
local step, call_id, claim_token, event, events_maxlen = unpack(ARGV, 1, 5)
local run, results_key, events_key = KEYS[1], KEYS[2], KEYS[3]

local held = redis.call('HGET', run, call_claim(step, call_id))
if not held then return 0 end
local token, deadline = claim_parts(held)
if token ~= claim_token or deadline == HANDED_ON then return 0 end
if redis.call('HEXISTS', results_key, call_id) == 1 then return 0 end
redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, event)
return 1
