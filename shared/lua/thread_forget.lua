-- Forget a thread the sweeper found free, unless it was touched since (its score changed: a submit
-- registers the thread before it is admitted to it).
-- KEYS: held threads zset. ARGV: member, score as read. Returns 1 if forgotten.
local member, score = unpack(ARGV, 1, 2)
if redis.call('ZSCORE', KEYS[1], member) ~= score then return 0 end
redis.call('ZREM', KEYS[1], member)
return 1
