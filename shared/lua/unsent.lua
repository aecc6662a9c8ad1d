-- A publish of a run's outbox failed (the broker refused it or could not be reached): its
-- unclaimed tasks are due again after delay_ms, marked unsent, so that the sweeper publishes them
-- without asking the broker for them (a broker that cannot be searched, RabbitMQ, would otherwise
-- be given the whole backlog allowance first) and without counting them as lost messages.
-- KEYS: run hash, leases zset. ARGV: run_id, version, epoch, delay_ms
-- Returns '1' if marked, '0' if the run is gone or moved past that version or epoch.
local run_id, version, epoch, delay_ms = unpack(ARGV, 1, 4)
local run, leases = KEYS[1], KEYS[2]
local head = redis.call('HMGET', run, F_VERSION, F_EPOCH)
if head[1] ~= version or head[2] ~= epoch then return '0' end
local due = now_ms() + tonumber(delay_ms)
redis.call('HSET', run, F_QUEUED_UNTIL, due, F_QUEUED_CHECKS, QUEUED_UNSENT)
local score = redis.call('ZSCORE', leases, run_id)
if not score or tonumber(score) > due then redis.call('ZADD', leases, due, run_id) end
return '1'
