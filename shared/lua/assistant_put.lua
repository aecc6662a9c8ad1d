-- Append a version to an assistant (its versions are never rewritten: a run pinned to one reads it
-- as it was), creating the assistant with its first one. The newest version is the current one.
-- KEYS: versions list, the tenant's index. ARGV: name, mode ('create' or another change), the
-- version's JSON, expected (the current version the change was made against; '' for any),
-- max_versions, max_assistants.
-- An assistant is the tenant's while its name is in the index; a deleted one's versions are kept a
-- while for the runs pinned to them (assistant_delete.lua), and creating the name again continues
-- their numbering, so that no version number ever means two configurations.
-- Returns {'ok', version} or {'exists' | 'missing' | 'moved' | 'full' | 'spent', current version}.
local versions, index = KEYS[1], KEYS[2]
local name, mode, record, expected, max_versions, max_assistants = unpack(ARGV, 1, 6)
local n = redis.call('LLEN', versions)
local live = redis.call('ZSCORE', index, name) ~= false
if mode == 'create' then
  if live then return {'exists', n} end
  if redis.call('ZCARD', index) >= tonumber(max_assistants) then return {'full', 0} end
  if n >= tonumber(max_versions) then return {'spent', n} end
  if n > 0 then redis.call('PERSIST', versions) end
else
  if not live then return {'missing', 0} end
  if expected ~= '' and tonumber(expected) ~= n then return {'moved', n} end
  if n >= tonumber(max_versions) then return {'full', n} end
end
redis.call('RPUSH', versions, record)
redis.call('ZADD', index, 0, name)
return {'ok', n + 1}
