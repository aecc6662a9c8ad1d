-- Ask a run to stop. KEYS: run hash. Returns the phase, or '' if the run does not exist.
local run = KEYS[1]
local phase = redis.call('HGET', run, F_PHASE)
if not phase then return '' end
if not TERMINAL[phase] then redis.call('HSET', run, F_CANCEL, '1') end
return phase
