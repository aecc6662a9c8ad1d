-- Remove runs the archive now holds from Redis: each run's keys and index entries, at once.
-- KEYS: for each run: its hash, leases zset, runs index, ended zset, then its other keys
--       (messages, checkpoints, events, attempts, step results: n_parts of them), then its
--       listing indexes (n_indexes of them)
-- ARGV: for each run: run_id, version (the version archived; 0: its keys are gone), n_parts, n_indexes
-- Only a run still ended at that version with no callback left to deliver is removed, so what is
-- deleted is exactly what was archived.
-- Returns, for each run in order, 'dropped', 'gone' (its keys had expired: its index entries are
-- removed) or 'changed'.
local outcomes = {}
local k = 0
for a = 1, #ARGV, 4 do
  local run_id, version = ARGV[a], ARGV[a + 1]
  local n_parts, n_indexes = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local run = KEYS[k + 1]
  local head = redis.call('HMGET', run, F_VERSION, F_PHASE, F_CALLBACK)
  if head[1] and (head[1] ~= version or not TERMINAL[head[2]] or head[3] == CALLBACK_PENDING) then
    outcomes[#outcomes + 1] = 'changed'
  else
    redis.call('DEL', run)
    for i = k + 5, k + 4 + n_parts do redis.call('DEL', KEYS[i]) end
    for i = k + 2, k + 4 do redis.call('ZREM', KEYS[i], run_id) end
    for i = k + 5 + n_parts, k + 4 + n_parts + n_indexes do redis.call('ZREM', KEYS[i], run_id) end
    outcomes[#outcomes + 1] = head[1] and 'dropped' or 'gone'
  end
  k = k + 4 + n_parts + n_indexes
end
return outcomes
