-- Ask a run to stop. KEYS: run hash. Returns the phase, or '' if the run does not exist.
local phase = redis.call('HGET', KEYS[1], 'phase')
if not phase then return '' end
if phase ~= 'completed' and phase ~= 'failed' and phase ~= 'interrupted' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
end
return phase
