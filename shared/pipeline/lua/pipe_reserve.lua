-- Take up to ARGV[2] items of step ARGV[1] to start, within the step's cap on live children
-- (pipe_take), with their input texts and current attempts. KEYS: meta, the step's items,
-- attempts. Returns pipe_take's {first item, count, texts..., attempts...} (count 0: none now).
return pipe_take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2]))
