-- Remove a run the archive now holds from Redis: its keys and its index entries, at once.
-- KEYS: run hash, leases zset, runs index, ended zset, then the run's other keys (messages,
--       checkpoints, events, attempts, step results: n_parts of them), then its listing indexes
-- ARGV: run_id, version (the version archived), n_parts
-- Only a run still ended at that version with no callback left to deliver is removed, so what is
-- deleted is exactly what was archived.
-- Returns 'dropped', 'gone' (its keys had expired: its index entries are removed) or 'changed'.
local run_id, version, n_parts = ARGV[1], ARGV[2], tonumber(ARGV[3])
local run = KEYS[1]
local head = redis.call('HMGET', run, F_VERSION, F_PHASE, F_CALLBACK)
if head[1] and (head[1] ~= version or not TERMINAL[head[2]] or head[3] == CALLBACK_PENDING) then
  return 'changed'
end
redis.call('DEL', run)
for i = 5, 4 + n_parts do redis.call('DEL', KEYS[i]) end
for i = 2, 4 do redis.call('ZREM', KEYS[i], run_id) end
for i = 5 + n_parts, #KEYS do redis.call('ZREM', KEYS[i], run_id) end
if head[1] then return 'dropped' end
return 'gone'
