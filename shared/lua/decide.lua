-- Record a human decision on a parked run. KEYS: 1 run hash. ARGV: 1 expected_version, 2 decision_json
-- Returns 1 if recorded, 0 if the run is not parked at that version (already decided, or moved on).
if redis.call('HGET', KEYS[1], 'phase') ~= 'awaiting_approval' or redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
  return 0
end
if redis.call('HSETNX', KEYS[1], 'decision', ARGV[2]) == 0 then return 0 end
return 1
