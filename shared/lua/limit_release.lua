-- End one model call's hold on a provider limit, and feed back what the call learnt.
-- KEYS: the limit's state hash, its slots zset
-- ARGV: the holder's id ('' when nothing is held), tokens per minute (0 = none), tokens the call
--   used beyond its estimate (negative: fewer), back-off asked for by the provider (ms, 0 = none)
-- The token bucket is charged the difference (it may go into debt, at most one minute's worth);
-- a back-off moves the limit's ``until`` later, never earlier, so the whole pool waits it out.
local holder, tpm, extra, back_off_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state, slots = KEYS[1], KEYS[2]
local now = now_ms()
if holder ~= '' then redis.call('ZREM', slots, holder) end
if tpm > 0 and extra ~= 0 then
  local st = redis.call('HMGET', state, LIMIT_TPM, LIMIT_TPM_AT)
  local level = tpm
  if st[1] then
    level = tonumber(st[1]) + (now - tonumber(st[2] or now)) * tpm / 60000
    if level > tpm then level = tpm end
  end
  level = level - extra
  if level < -tpm then level = -tpm end
  redis.call('HSET', state, LIMIT_TPM, tostring(level), LIMIT_TPM_AT, now)
  redis.call('PEXPIRE', state, 120000)
end
if back_off_ms > 0 then
  local until_ms = now + back_off_ms
  if until_ms > tonumber(redis.call('HGET', state, LIMIT_UNTIL) or '0') then
    redis.call('HSET', state, LIMIT_UNTIL, until_ms)
  end
  redis.call('PEXPIRE', state, back_off_ms + 120000)
end
return 1
