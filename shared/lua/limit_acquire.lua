-- Take capacity from one provider limit for one model call, or say why not and for how long.
-- KEYS: the limit's state hash, its slots zset (holders of concurrent calls, by lease deadline)
-- ARGV: requests per minute, tokens per minute, concurrent calls (0 = no such limit), the call's
--   estimated tokens, the holder's id, the slot's lease (ms)
-- Both buckets refill continuously (per minute / 60000 per ms) up to one minute's worth, by
-- Redis's clock. The token bucket may be in debt after a call used more than estimated: no call
-- is granted until it is refilled. A back-off set from a provider's 429 (``until``) stops every
-- grant until it passes. A slot whose lease ran out (its holder died) is free again.
-- Nothing is written unless the call is granted.
-- Returns {'ok', 0} or {reason, wait_ms}: 'retry_after', 'concurrency' (wait unknown: 0), 'rpm', 'tpm'.
local rpm, tpm, conc, want, holder, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local state, slots = KEYS[1], KEYS[2]
local now = now_ms()
local st = redis.call('HMGET', state, LIMIT_UNTIL, LIMIT_RPM, LIMIT_RPM_AT, LIMIT_TPM, LIMIT_TPM_AT)
local back_off = tonumber(st[1] or '0')
if back_off > now then return {'retry_after', back_off - now} end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  if not redis.call('ZSCORE', slots, holder) and redis.call('ZCARD', slots) >= conc then
    return {'concurrency', 0}
  end
end
local function refill(tokens, at, per_minute)
  if not tokens then return per_minute end
  local level = tokens + (now - (at or now)) * per_minute / 60000
  if level > per_minute then level = per_minute end
  return level
end
local requests, tokens
if rpm > 0 then
  requests = refill(tonumber(st[2]), tonumber(st[3]), rpm)
  if requests < 1 then return {'rpm', math.ceil((1 - requests) * 60000 / rpm)} end
end
if tpm > 0 then
  tokens = refill(tonumber(st[4]), tonumber(st[5]), tpm)
  local need = math.min(want, tpm)
  if tokens < need then return {'tpm', math.ceil((need - tokens) * 60000 / tpm)} end
end
if rpm > 0 then redis.call('HSET', state, LIMIT_RPM, tostring(requests - 1), LIMIT_RPM_AT, now) end
if tpm > 0 then redis.call('HSET', state, LIMIT_TPM, tostring(tokens - want), LIMIT_TPM_AT, now) end
if conc > 0 then
  redis.call('ZADD', slots, now + lease_ms, holder)
  redis.call('PEXPIRE', slots, lease_ms * 2 + 60000)
end
if rpm > 0 or tpm > 0 then redis.call('PEXPIRE', state, 120000) end
return {'ok', 0}
