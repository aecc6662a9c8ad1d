-- Record one item's result once, give its slot back, and finish the eval when nothing is left.
-- KEYS: results, slots, scoring, counts, meta, pending, active, cases.
-- ARGV: item, result JSON, variant index, passed (0/1), failed (0/1), tokens, cost_micro,
-- eval_id, finished_ms, retention_ms. Returns 0 if it was recorded already, else 1 if items wait
-- to start (one may take the slot given back) or 2 if none does (Recorded in store.py).
-- A completed eval's keys expire after the retention.
local item, variant = ARGV[1], ARGV[3]
if redis.call('HSETNX', KEYS[1], item, ARGV[2]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], item)
redis.call('ZREM', KEYS[3], item)
redis.call('HINCRBY', KEYS[4], variant_field(variant, EVAL_DONE), 1)
redis.call('HINCRBY', KEYS[4], variant_field(variant, EVAL_PASSED), tonumber(ARGV[4]))
redis.call('HINCRBY', KEYS[4], variant_field(variant, EVAL_FAILED), tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[4], variant_field(variant, EVAL_TOKENS), tonumber(ARGV[6]))
redis.call('HINCRBY', KEYS[4], variant_field(variant, EVAL_COST_MICRO), tonumber(ARGV[7]))
redis.call('HINCRBY', KEYS[4], EVAL_TOKENS, tonumber(ARGV[6]))
redis.call('HINCRBY', KEYS[4], EVAL_COST_MICRO, tonumber(ARGV[7]))
if redis.call('ZCARD', KEYS[2]) == 0 then
  if redis.call('LLEN', KEYS[6]) == 0 then
    redis.call('HSET', KEYS[5], EVAL_STATUS, EVAL_COMPLETED, EVAL_FINISHED_AT, ARGV[9])
    redis.call('SREM', KEYS[7], ARGV[8])
    for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8]}) do
      redis.call('PEXPIRE', key, tonumber(ARGV[10]))
    end
  elseif redis.call('HGET', KEYS[5], EVAL_STATUS) ~= EVAL_RUNNING then
    -- Stopped (cancelled, or out of budget) and drained: nothing more happens until a resume.
    redis.call('SREM', KEYS[7], ARGV[8])
  end
end
if redis.call('LLEN', KEYS[6]) == 0 then return 2 end
return 1
