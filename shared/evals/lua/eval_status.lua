-- Move an eval between running and stopped. KEYS: meta, active, slots.
-- ARGV: eval_id, new status, then the statuses it may move from.
-- Returns the status it was in ('' if no such eval); moved only if that status is allowed.
local current = redis.call('HGET', KEYS[1], EVAL_STATUS)
if not current then return '' end
for i = 3, #ARGV do
  if current == ARGV[i] then
    redis.call('HSET', KEYS[1], EVAL_STATUS, ARGV[2])
    if ARGV[2] == EVAL_RUNNING then
      redis.call('SADD', KEYS[2], ARGV[1])
    elseif redis.call('ZCARD', KEYS[3]) == 0 then
      redis.call('SREM', KEYS[2], ARGV[1])
    end
    return current
  end
end
return current
