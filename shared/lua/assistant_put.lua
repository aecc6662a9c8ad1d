-- Append a version to an assistant (its versions are never rewritten: a run pinned to one reads it
-- as it was), creating the assistant with its first one. The newest version is the current one.
-- KEYS: versions list, the tenant's index, the tenant's sizes (hash: name -> bytes its versions
-- hold, and the total under '*total'), the tenant's kept (sorted set: deleted names -> when, in
-- ms, their versions expire).
-- ARGV: name, mode ('create' or another change), the version's JSON, expected (the current version
-- the change was made against; '' for any), max_versions, max_assistants, max_bytes.
-- An assistant is the tenant's while its name is in the index; a deleted one's versions are kept a
-- while for the runs pinned to them (assistant_delete.lua), and creating the name again continues
-- their numbering, so that no version number ever means two configurations.
-- The bytes of every version the tenant's Redis holds count against max_bytes, a deleted
-- assistant's kept versions included until they expire: deleting and creating names again must
-- not let a tenant hold more than its quota.
-- Returns {'ok', version} or {'exists' | 'missing' | 'moved' | 'full' | 'spent', current version}
-- or {'over', bytes held, ms when the next deleted assistant's versions expire (0: none)}.
local versions, index, sizes, kept = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local name, mode, record, expected, max_versions, max_assistants, max_bytes = unpack(ARGV, 1, 7)
local TOTAL = '*total'  -- no assistant's name starts with '*'
-- What Redis spends beside the JSON, counted with it: a list entry per version, and per name its
-- list key, expiry, sizes field and kept entry (measured: about 350 bytes a name).
local PER_VERSION, PER_NAME = 32, 512

local function forget(old)
  local size = tonumber(redis.call('HGET', sizes, old) or '0')
  if size ~= 0 then redis.call('HINCRBY', sizes, TOTAL, -size) end
  redis.call('HDEL', sizes, old)
  redis.call('ZREM', kept, old)
end

-- Every change adds a version: at a full Redis it is refused before the purge below writes.
refuse_when_full(index)
-- Deleted assistants whose versions have expired since no longer count (a bounded few per write).
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', kept, '-inf', now_ms, 'LIMIT', 0, 100)) do
  forget(old)
end

local n = redis.call('LLEN', versions)
local live = redis.call('ZSCORE', index, name) ~= false
if mode == 'create' then
  if live then return {'exists', n} end
  if redis.call('ZCARD', index) >= tonumber(max_assistants) then return {'full', 0} end
  if n >= tonumber(max_versions) then return {'spent', n} end
else
  if not live then return {'missing', 0} end
  if expected ~= '' and tonumber(expected) ~= n then return {'moved', n} end
  if n >= tonumber(max_versions) then return {'full', n} end
end

if n == 0 then
  forget(name)  -- a deleted name whose versions expired before the purge above reached it
elseif redis.call('HEXISTS', sizes, name) == 0 then
  -- Versions written before their bytes were counted: counted once, at the name's next change.
  local size = PER_NAME
  for _, version in ipairs(redis.call('LRANGE', versions, 0, -1)) do size = size + #version + PER_VERSION end
  redis.call('HSET', sizes, name, size)
  redis.call('HINCRBY', sizes, TOTAL, size)
end
local cost = #record + PER_VERSION
if n == 0 then cost = cost + PER_NAME end
local held = tonumber(redis.call('HGET', sizes, TOTAL) or '0')
if held + cost > tonumber(max_bytes) then
  local next_free = redis.call('ZRANGE', kept, 0, 0, 'WITHSCORES')
  return {'over', held, tonumber(next_free[2] or '0')}
end

if mode == 'create' and n > 0 then
  redis.call('PERSIST', versions)
  redis.call('ZREM', kept, name)
end
redis.call('RPUSH', versions, record)
redis.call('ZADD', index, 0, name)
redis.call('HINCRBY', sizes, name, cost)
redis.call('HINCRBY', sizes, TOTAL, cost)
return {'ok', n + 1}
