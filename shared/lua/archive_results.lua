-- Read the tool results of a batch of ended runs, for the archiver: one call instead of one
-- command a step (every key of a shard shares its hash tag, so the batch is one slot).
-- KEYS: the step results hashes
-- Returns, for each in order, its fields and values (call id, result JSON, ...).
local replies = {}
for i = 1, #KEYS do replies[i] = redis.call('HGETALL', KEYS[i]) end
return replies
