-- Which of some task ids are among the messages of one Celery queue list, read in chunks so Redis
-- is never blocked long. KEYS: the queue's list. ARGV: start, count, then the task ids looked for.
-- Returns {items read, {task ids found}}: the caller goes on at start + items read until 0.
local start, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local wanted = {}
for i = 3, #ARGV do wanted[ARGV[i]] = true end
local items = redis.call('LRANGE', KEYS[1], start, start + count - 1)
local found = {}
for _, item in ipairs(items) do
  -- kombu's message JSON names the task id in its headers: "id": "<task id>"
  local id = string.match(item, '"id": "([^"]*)"')
  if id and wanted[id] then found[#found + 1] = id end
end
return {#items, found}
