-- Give a claim up. KEYS: run hash, attempts hash
-- mode 'token': delete the claim if this token holds it (a delivery that will not do the work, e.g.
--   a decide that finds no decision yet), and take its claim back out of the work's attempts at
--   version: a delivery that found nothing to do did not try the work, and a parked run that many
--   messages or early decides reach must not count them towards its poison limit.
-- mode 'holder': the process named by holder is known to be dead (its worker's main process saw it
--   die): expire its claim now, so the next delivery takes the work over without waiting for the
--   lease, and remember why under the attempt's last error.
-- Returns 1 if a claim was released or expired, else 0.
local field, mode, token_or_holder, version, reason = unpack(ARGV, 1, 5)
local run, attempts_key = KEYS[1], KEYS[2]

local current = redis.call('HGET', run, field)
if not current then return 0 end
local held_by, _, holder = claim_parts(current)
if mode == 'token' then
  if held_by ~= token_or_holder then return 0 end
  redis.call('HDEL', run, field)
  local counted = attempts_field(version, field)
  if tonumber(redis.call('HGET', attempts_key, counted) or '0') > 0 then
    redis.call('HINCRBY', attempts_key, counted, -1)
  end
  return 1
end
local _, deadline = claim_parts(current)
if holder ~= token_or_holder or deadline == HANDED_ON then return 0 end  -- not its, or handed on
redis.call('HSET', run, field, claim_value(held_by, 0, holder))
if reason ~= '' then redis.call('HSET', attempts_key, last_error_field(version, field), reason) end
return 1
