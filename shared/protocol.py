"""The Redis protocol of a run, spelled once for Python and Lua.

A run is a hash (see :mod:`shared.keys`) whose fields are named here. The Lua scripts get these
names, the phase names and the claim format from a generated prelude (:func:`lua_prelude`), so a
field renamed here is renamed everywhere.

Everything else a script reads or writes is named here too: the callback's states, the fields of
the attempts hash, of a pipeline run's and an eval's hashes and of a provider limit's state, the
field of an events stream entry. A script spells none of them itself (``test_lua_protocol``).

A *claim* is a field of the run hash whose value is ``token|deadline_ms|holder``: the token of the
delivery that holds it, the Redis time (milliseconds) until which it is held unless renewed, and
the process holding it (``host:pid``). The phase claim of think, observe, start and decide is the
field :data:`RUNNING`; each tool call has its own claim field, :func:`call_claim`, naming the step
and the call. Deadlines always come from Redis's clock (``TIME`` inside the scripts), so hosts
whose clocks disagree agree on when a claim expired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.state import TERMINAL_PHASES, Phase

__all__ = [
    "ATTEMPTS_PREFIX",
    "BODY",
    "CALLBACK",
    "CALLBACK_DELIVERED",
    "CALLBACK_GAVE_UP",
    "CALLBACK_PENDING",
    "CALLBACK_STATE",
    "CALLS",
    "CHILDREN_ENDED",
    "CALL_CLAIM_PREFIX",
    "CANCEL",
    "CREATED",
    "ClaimValue",
    "DECISION",
    "EMPTY_OUTBOX",
    "EPOCH",
    "EVAL_BUDGET_EXHAUSTED",
    "EVAL_COMPLETED",
    "EVAL_COST_MICRO",
    "EVAL_DONE",
    "EVAL_FAILED",
    "EVAL_FINISHED_AT",
    "EVAL_PASSED",
    "EVAL_RUNNING",
    "EVAL_STATUS",
    "EVAL_TOKENS",
    "EVENT_FIELD",
    "INBOX_BYTES",
    "INBOX_DIGEST_PREFIX",
    "INBOX_KEY_PREFIX",
    "INBOX_NEXT",
    "INBOX_OUTCOME_PREFIX",
    "INBOX_SIGNAL_PREFIX",
    "LAST_ERROR_PREFIX",
    "LIMIT_RPM",
    "LIMIT_RPM_AT",
    "LIMIT_TPM",
    "LIMIT_TPM_AT",
    "LIMIT_UNTIL",
    "LOST_PREFIX",
    "MISSING_PHASE_TASK",
    "OP",
    "OUTBOX",
    "OUTBOX_CLAIMED",
    "PHASE",
    "PIPE_CAP",
    "PIPE_CREATED_AT",
    "PIPE_DONE",
    "PIPE_ERROR",
    "PIPE_EVENT_FIELD",
    "PIPE_FINISHED_MS",
    "PIPE_INDEX",
    "PIPE_KIND",
    "PIPE_OUTPUT",
    "PIPE_RUNNING",
    "PIPE_SEQ",
    "PIPE_STARTED",
    "PIPE_STATUS",
    "PIPE_TARGET",
    "PIPE_TOTAL",
    "PIPE_UPDATED_MS",
    "QUEUED_CHECKS",
    "QUEUED_UNSENT",
    "QUEUED_UNTIL",
    "REQUEST",
    "RUNNING",
    "STEP",
    "SCHED_COUNTER_FAILED",
    "SCHED_COUNTER_MISSED",
    "SCHED_COUNTER_SKIPPED",
    "SCHED_COUNTER_STARTED",
    "SCHED_AFTER",
    "SCHED_DECISION_PREFIX",
    "SCHED_ENDED",
    "SCHED_LAST_RUN",
    "SCHED_NEXT",
    "SCHED_PAUSED",
    "SCHED_SPEC",
    "SCHED_YES",
    "TASK_DONE",
    "TASK_EXPIRED",
    "TASK_LIVE",
    "TASK_UNCLAIMED",
    "THROTTLED",
    "THROTTLED_UNTIL",
    "THROTTLES",
    "THROTTLE_OP",
    "THREAD_ACTIVE",
    "THREAD_SINCE",
    "THREAD_WAIT",
    "VARIANT_PREFIX",
    "VERSION",
    "attempts_field",
    "call_claim",
    "last_error_field",
    "lost_field",
    "lua_prelude",
    "variant_field",
]

# -- fields of the run hash --------------------------------------------------------------------------

#: The committed version: the fencing token of every commit (compare-and-set).
VERSION = "version"
PHASE = "phase"
STEP = "step"
#: Bumped each time the sweeper hands the run's current phase on; messages of older epochs are stale.
EPOCH = "epoch"
#: What the producer asked for (agent, input, thread, metadata): written once, when the run is created.
REQUEST = "request"
#: The rest of the head, rewritten by every commit (and copied into the checkpoint list).
BODY = "body"
#: JSON list of the tasks that carry the run to its next phase (stamped with the epoch when sent).
OUTBOX = "outbox"
#: "1" once a delivery of the outbox claimed work at this version.
OUTBOX_CLAIMED = "outbox_claimed"
#: Comma-separated ids of the current step's tool calls (ACTING), checked against tool messages.
CALLS = "calls"
#: Redis time (ms) until which unclaimed outbox tasks are only waiting in the broker.
QUEUED_UNTIL = "queued_until"
#: How many times the sweeper checked the broker for this version's unclaimed tasks (backoff), or
#: QUEUED_UNSENT once a publish of them failed.
QUEUED_CHECKS = "queued_checks"
#: QUEUED_CHECKS of unclaimed tasks whose publish failed (the broker refused or could not be
#: reached): the sweeper publishes them again without asking the broker, and counts no loss.
QUEUED_UNSENT = -1
CANCEL = "cancel"
DECISION = "decision"
#: The version at which every child run of a parent parked for its subagents had ended: the
#: parent is owed its resume (its decide task) from then on, whether or not that message arrives.
#: Stale (and ignored) once the parent commits past that version.
CHILDREN_ENDED = "children_ended"
#: Id of the last write that succeeded, so a script replayed after a lost reply knows it ran.
OP = "op"
#: The phase claim of think, observe, start and decide (and of a callback's delivery, once ended).
RUNNING = "running"
#: When the run was created (Redis time, ms): its score in every index.
CREATED = "created"
#: A callback still to deliver (CALLBACK_PENDING), or how it ended (CALLBACK_DELIVERED,
#: CALLBACK_GAVE_UP).
CALLBACK = "callback"
#: JSON of the callback's delivery: attempts, last error, when it was delivered.
CALLBACK_STATE = "callback_state"

#: JSON: why the run's think waits for provider capacity (limit, reason, version, ``until`` in Redis
#: ms); informative, left in place until the next throttle (compare its version with the run's).
THROTTLED = "throttled"
#: How many times the run's thinks were re-queued for provider capacity.
THROTTLES = "throttles"
#: Token of the claim whose throttle was written last (a replayed throttle script recognises it).
THROTTLE_OP = "throttle_op"

#: JSON while the run waits, parked without a worker, for its thread's previous run to end
#: (``thread_id``, ``waiting_for``: that run's id); removed when the run is woken.
THREAD_WAIT = "thread_wait"

#: Prefix of a tool call's claim field: ``call:<step>:<call_id>``.
CALL_CLAIM_PREFIX = "call:"

# -- fields of a thread's state hash (``Keys.thread_state``) ------------------------------------------

#: The run that holds the thread: the one running, or the next to start ('' or absent: none).
THREAD_ACTIVE = "active"
#: When that run was given the thread (Redis ms).
THREAD_SINCE = "since"

# -- values of run hash fields -------------------------------------------------------------------------

#: The values of CALLBACK.
CALLBACK_PENDING = "pending"
CALLBACK_DELIVERED = "delivered"
CALLBACK_GAVE_UP = "gave_up"
#: OUTBOX of a run that has none.
EMPTY_OUTBOX = "[]"
#: The key of THROTTLED's JSON naming when the think may run again (Redis ms).
THROTTLED_UNTIL = "until"

# -- the run's events stream ------------------------------------------------------------------------

#: The field of each entry of a run's events stream: the event's JSON.
EVENT_FIELD = "e"

# -- the sweeper's view of a phase's tasks -----------------------------------------------------------

#: The state of one task of the current phase (``task_states`` in the prelude): its result is in,
#: its claim is live, its claim expired, or nobody holds it (its message is in the broker, or lost).
TASK_DONE = "done"
TASK_LIVE = "live"
TASK_EXPIRED = "expired"
TASK_UNCLAIMED = "unclaimed"
#: The phase claim's task (key '' among the task states) in a list of tasks missing from the broker.
MISSING_PHASE_TASK = "-"


def call_claim(step: int, call_id: str) -> str:
    return f"{CALL_CLAIM_PREFIX}{step}:{call_id}"


# -- fields of the attempts hash ---------------------------------------------------------------------
# The Lua helpers of the same names (in the prelude) build these from the same prefixes.

# -- fields of a run's inbox (``Keys.inbox``): the signals sent into it ---------------------------

#: The last sequence number given to a signal of the run.
INBOX_NEXT = "next"
#: The bytes of every signal body taken so far (bounded per run).
INBOX_BYTES = "bytes"
#: ``s:<seq>``: the signal as JSON.
INBOX_SIGNAL_PREFIX = "s:"
#: ``k:<client key>``: the sequence number of the signal sent under that key.
INBOX_KEY_PREFIX = "k:"
#: ``d:<seq>``: the digest of a keyed signal's body (the same key with another body conflicts).
INBOX_DIGEST_PREFIX = "d:"
#: ``o:<seq>``: what applying the signal gave, as JSON (read once the head's cursor covers it).
INBOX_OUTCOME_PREFIX = "o:"

ATTEMPTS_PREFIX = "v"
LAST_ERROR_PREFIX = "err:"
LOST_PREFIX = "lost:"


def attempts_field(version: int, claim_field: str) -> str:
    """Claims of one piece of work at one version: deliveries that started it (poison detection)."""
    return f"{ATTEMPTS_PREFIX}{version}:{claim_field}"


def last_error_field(version: int, claim_field: str) -> str:
    """The last thing known to have gone wrong with that work (a lost worker, an expired lease)."""
    return LAST_ERROR_PREFIX + attempts_field(version, claim_field)


def lost_field(version: int) -> str:
    """Times the sweeper re-published this version's tasks because they vanished from the broker."""
    return f"{LOST_PREFIX}{ATTEMPTS_PREFIX}{version}"


# -- a pipeline run's meta hash (``Keys.pipe_meta``) ---------------------------------------------------

PIPE_STATUS = "status"
#: The step it is at (-1: not started), in which pipeline (target), at which index of it.
PIPE_SEQ = "seq"
PIPE_TARGET = "target"
PIPE_INDEX = "index"
PIPE_KIND = "kind"
#: The current step's cap on live children, its item count, items started and items recorded.
PIPE_CAP = "cap"
PIPE_TOTAL = "total"
PIPE_STARTED = "started"
PIPE_DONE = "done"
PIPE_UPDATED_MS = "updated_ms"
PIPE_OUTPUT = "output"
PIPE_ERROR = "error"
PIPE_FINISHED_MS = "finished_ms"
#: When it was created (``repr`` of Unix seconds): with its id, which pipeline run it is (an id
#: may be used again once its run expired).
PIPE_CREATED_AT = "created_at"
#: PIPE_STATUS while the pipeline run goes on (any other status is how it ended).
PIPE_RUNNING = "running"
#: The field of each entry of a pipeline run's events stream: the event's JSON.
PIPE_EVENT_FIELD = "event"

# -- an eval's meta and counts hashes (``Keys.eval_meta``, ``Keys.eval_counts``) -----------------------

EVAL_STATUS = "status"
EVAL_FINISHED_AT = "finished_at"
#: Values of EVAL_STATUS the scripts write or test.
EVAL_RUNNING = "running"
EVAL_COMPLETED = "completed"
EVAL_BUDGET_EXHAUSTED = "budget_exhausted"
#: Counts, of the whole eval and per variant (:func:`variant_field`).
EVAL_DONE = "done"
EVAL_PASSED = "passed"
EVAL_FAILED = "failed"
EVAL_TOKENS = "tokens"
EVAL_COST_MICRO = "cost_micro"
VARIANT_PREFIX = "v"


def variant_field(variant: int | str, count: str) -> str:
    """One variant's count in an eval's counts hash: ``v<variant>:<count>``."""
    return f"{VARIANT_PREFIX}{variant}:{count}"


# -- a provider limit's state hash (``shared.limits``) ------------------------------------------------

#: Redis ms until which a provider's back-off stops every grant.
LIMIT_UNTIL = "until"
#: Each bucket's level and the Redis ms it was measured at.
LIMIT_RPM = "rpm"
LIMIT_RPM_AT = "rpm_at"
LIMIT_TPM = "tpm"
LIMIT_TPM_AT = "tpm_at"


# -- a schedule's hash (``Keys.sched``, ``shared/schedules.py``) -------------------------------------

#: The schedule's spec (JSON; changed only by an update), its next tick (Unix seconds), whether it is paused
#: (SCHED_YES), the run id of its last started tick.
SCHED_SPEC = "spec"
SCHED_NEXT = "next_fire"
SCHED_PAUSED = "paused"
SCHED_YES = "1"
SCHED_LAST_RUN = "last_run"
#: ``<prefix><tick>``: the decision (run or skip) recorded for a tick being fired.
SCHED_DECISION_PREFIX = "decide:"
#: The next tick of a schedule that fires no more (its end date passed): never a tick itself.
SCHED_ENDED = "0"
#: The tick after the one in flight, when the timing changed while that tick was being fired
#: (its advance moves on to this rather than to its own timing's next).
SCHED_AFTER = "after"
#: Ticks started, skipped (overlap), missed (outage) and refused.
SCHED_COUNTER_STARTED = "n_started"
SCHED_COUNTER_SKIPPED = "n_skipped"
SCHED_COUNTER_MISSED = "n_missed"
SCHED_COUNTER_FAILED = "n_failed"


# -- claims ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimValue:
    """A claim as stored: the holder's token, its deadline (Redis time, ms) and the holding process."""

    token: str
    deadline_ms: int
    holder: str

    @classmethod
    def parse(cls, raw: str) -> ClaimValue:
        token, deadline, holder = raw.split("|", 2)
        return cls(token, int(deadline), holder)

    def dump(self) -> str:
        return f"{self.token}|{self.deadline_ms}|{self.holder}"


# -- Lua -----------------------------------------------------------------------------------------------

_FIELDS = {
    "F_VERSION": VERSION,
    "F_PHASE": PHASE,
    "F_STEP": STEP,
    "F_EPOCH": EPOCH,
    "F_REQUEST": REQUEST,
    "F_BODY": BODY,
    "F_OUTBOX": OUTBOX,
    "F_OUTBOX_CLAIMED": OUTBOX_CLAIMED,
    "F_CALLS": CALLS,
    "F_QUEUED_UNTIL": QUEUED_UNTIL,
    "F_QUEUED_CHECKS": QUEUED_CHECKS,
    "QUEUED_UNSENT": str(QUEUED_UNSENT),
    "F_CANCEL": CANCEL,
    "F_DECISION": DECISION,
    "F_CHILDREN_ENDED": CHILDREN_ENDED,
    "F_OP": OP,
    "F_RUNNING": RUNNING,
    "F_CREATED": CREATED,
    "F_CALLBACK": CALLBACK,
    "F_CALLBACK_STATE": CALLBACK_STATE,
    "F_THROTTLED": THROTTLED,
    "F_THROTTLES": THROTTLES,
    "F_THROTTLE_OP": THROTTLE_OP,
    "F_THREAD_WAIT": THREAD_WAIT,
    "F_THREAD_ACTIVE": THREAD_ACTIVE,
    "F_THREAD_SINCE": THREAD_SINCE,
    "CALL_CLAIM_PREFIX": CALL_CLAIM_PREFIX,
}

#: Every other name, state and format the scripts use, under its Python name.
_VALUES = {
    name: globals()[name]
    for name in (
        "CALLBACK_PENDING",
        "CALLBACK_DELIVERED",
        "CALLBACK_GAVE_UP",
        "EMPTY_OUTBOX",
        "THROTTLED_UNTIL",
        "EVENT_FIELD",
        "TASK_DONE",
        "TASK_LIVE",
        "TASK_EXPIRED",
        "TASK_UNCLAIMED",
        "MISSING_PHASE_TASK",
        "ATTEMPTS_PREFIX",
        "INBOX_NEXT",
        "INBOX_BYTES",
        "INBOX_SIGNAL_PREFIX",
        "INBOX_KEY_PREFIX",
        "INBOX_DIGEST_PREFIX",
        "LAST_ERROR_PREFIX",
        "LOST_PREFIX",
        "PIPE_STATUS",
        "PIPE_SEQ",
        "PIPE_TARGET",
        "PIPE_INDEX",
        "PIPE_KIND",
        "PIPE_CAP",
        "PIPE_TOTAL",
        "PIPE_STARTED",
        "PIPE_DONE",
        "PIPE_UPDATED_MS",
        "PIPE_OUTPUT",
        "PIPE_ERROR",
        "PIPE_FINISHED_MS",
        "PIPE_CREATED_AT",
        "PIPE_RUNNING",
        "PIPE_EVENT_FIELD",
        "EVAL_STATUS",
        "EVAL_FINISHED_AT",
        "EVAL_RUNNING",
        "EVAL_COMPLETED",
        "EVAL_BUDGET_EXHAUSTED",
        "EVAL_DONE",
        "EVAL_PASSED",
        "EVAL_FAILED",
        "EVAL_TOKENS",
        "EVAL_COST_MICRO",
        "VARIANT_PREFIX",
        "LIMIT_UNTIL",
        "LIMIT_RPM",
        "LIMIT_RPM_AT",
        "LIMIT_TPM",
        "LIMIT_TPM_AT",
        "SCHED_SPEC",
        "SCHED_NEXT",
        "SCHED_PAUSED",
        "SCHED_YES",
        "SCHED_LAST_RUN",
        "SCHED_DECISION_PREFIX",
        "SCHED_ENDED",
        "SCHED_AFTER",
    )
}

_HELPERS = """
-- Take up to 'want' items of step 'seq' of the pipeline run whose meta hash is 'meta' to start
-- now, within the step's cap on live children ('items', 'attempts': the step's hashes of input
-- texts and current attempts). An item is live from here until its result is recorded
-- (pipe_record), so the cap holds across the pool whoever takes items. Returns {first item,
-- count, then the input text of each, then the current attempt of each} (count 0: none now).
local function pipe_take(meta, items, attempts, seq, want)
  local f = redis.call('HMGET', meta, PIPE_STATUS, PIPE_SEQ, PIPE_STARTED, PIPE_DONE, PIPE_CAP, PIPE_TOTAL)
  if f[1] ~= PIPE_RUNNING or f[2] ~= seq then return {0, 0} end
  local started, done = tonumber(f[3]), tonumber(f[4])
  local n = math.min(tonumber(f[5]) - (started - done), tonumber(f[6]) - started, want)
  if n <= 0 then return {started, 0} end
  redis.call('HSET', meta, PIPE_STARTED, tostring(started + n))
  local fields = {}
  for i = 1, n do fields[i] = tostring(started + i - 1) end
  local texts = redis.call('HMGET', items, unpack(fields))
  local tries = redis.call('HMGET', attempts, unpack(fields))
  local taken = {started, n}
  for i = 1, n do taken[2 + i] = texts[i] or '' end
  for i = 1, n do taken[2 + n + i] = tries[i] or '0' end
  return taken
end
-- Run the broker commands of a publish (ARGV from index 'at': the epoch they were built for, their
-- count, then name, argument count and arguments of each) if the run is still at that epoch
-- ('epoch': the run's epoch field, which the caller has read).
-- Returns '1' if it ran them, '0' if the caller must publish (nothing is run then). HDEL and ZREM
-- are kombu's ack of the message the committing delivery came from: run with the publish, or not
-- at all (the worker then acknowledges it as kombu does).
local PUSH_COMMANDS = {
  lpush = 'LPUSH', publish = 'PUBLISH', pexpire = 'PEXPIRE', hdel = 'HDEL', zrem = 'ZREM',
}
local function push_broker(epoch, at)
  local n = tonumber(ARGV[at + 1])
  if n == 0 or (epoch or '0') ~= ARGV[at] then return '0' end
  local commands, i = {}, at + 2
  for _ = 1, n do
    local command, argc = PUSH_COMMANDS[ARGV[i]], tonumber(ARGV[i + 1])
    if not command or argc ~= 2 then return '0' end
    commands[#commands + 1] = {command, ARGV[i + 2], ARGV[i + 3]}
    i = i + 2 + argc
  end
  for _, c in ipairs(commands) do redis.call(c[1], c[2], c[3]) end
  return '1'
end
-- Stop here (OOM error, nothing written) when Redis is at maxmemory under noeviction. Redis refuses
-- a command of a script that may add data only until the script's first write, whatever that
-- write did: a script whose first write is a purge or a delete would go on to add data past
-- maxmemory. So a script that adds data on a tenant's or a producer's behalf calls this before it
-- writes anything: ZADD may add data, so a full Redis refuses it; with XX (update only) and INCR
-- by 0 on the member '' it changes nothing (no such member is added, an existing score stays), and
-- on a missing key creates nothing (both options are older than any Redis the store runs on).
-- 'zset' is one of the script's KEYS that is a sorted set or absent (another type would be a
-- WRONGTYPE error).
local function refuse_when_full(zset)
  redis.call('ZADD', zset, 'XX', 'INCR', 0, '')
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A claim is 'token|deadline_ms|holder'.
-- The deadline of a call claim the sweeper handed on: the claim stays as a marker (the next
-- delivery of the call must know an earlier one may have had its effect), but it is no longer
-- expired work to hand on: only a new holder's claim can expire again.
local HANDED_ON = -1
local function claim_parts(value)
  local a = string.find(value, '|', 1, true)
  local b = string.find(value, '|', a + 1, true)
  return string.sub(value, 1, a - 1), tonumber(string.sub(value, a + 1, b - 1)), string.sub(value, b + 1)
end
local function claim_value(token, deadline, holder)
  return token .. '|' .. tostring(deadline) .. '|' .. holder
end
local function call_claim(step, call_id)
  return CALL_CLAIM_PREFIX .. step .. ':' .. call_id
end
local function has_call(calls, call_id)
  return string.find(',' .. (calls or '') .. ',', ',' .. call_id .. ',', 1, true) ~= nil
end
-- Whether a comma-separated list given in ARGV names item (as has_call for the CALLS field).
local function listed(list, item)
  return string.find(',' .. list .. ',', ',' .. item .. ',', 1, true) ~= nil
end
-- Fields of the attempts hash, as protocol.py's functions of the same names build them.
local function attempts_field(version, field)
  return ATTEMPTS_PREFIX .. version .. ':' .. field
end
local function last_error_field(version, field)
  return LAST_ERROR_PREFIX .. attempts_field(version, field)
end
local function lost_field(version)
  return LOST_PREFIX .. ATTEMPTS_PREFIX .. version
end
-- The last error of work whose claim expired under a holder that stopped renewing it.
local function expired_error(reason, holder)
  return reason .. ' (held by ' .. holder .. ')'
end
-- THROTTLED: the JSON object 'why' with THROTTLED_UNTIL added.
local function throttled_info(why, until_ms)
  return string.sub(why, 1, -2) .. ',"' .. THROTTLED_UNTIL .. '":' .. until_ms .. '}'
end
-- One variant's count in an eval's counts hash (variant_field in protocol.py).
local function variant_field(variant, count)
  return VARIANT_PREFIX .. variant .. ':' .. count
end
-- The state of every task of the current phase: for ACTING one entry per call id (TASK_DONE,
-- TASK_LIVE, TASK_EXPIRED or TASK_UNCLAIMED), else one entry '' for the phase claim. Also returns
-- the earliest deadline of a live claim (or nil) and whether any task is expired or unclaimed.
local function task_states(run, results_key, phase, step, calls, now)
  local states, next_live, expired, unclaimed = {}, nil, false, false
  local function classify(key, claim)
    local state = TASK_UNCLAIMED
    local deadline = nil
    if claim then deadline = select(2, claim_parts(claim)) end
    if deadline == nil or deadline == HANDED_ON then
      -- No claim, or the marker a hand-on left: its new message is in the broker (or lost),
      -- which the broker decides; an expired claim would be handed on again every sweep.
      unclaimed = true
    elseif deadline > now then
      state = TASK_LIVE
      if not next_live or deadline < next_live then next_live = deadline end
    else
      state = TASK_EXPIRED
      expired = true
    end
    states[#states + 1] = key
    states[#states + 1] = state
  end
  if phase == P_ACTING then
    for id in string.gmatch(calls or '', '[^,]+') do
      if redis.call('HEXISTS', results_key, id) == 1 then
        states[#states + 1] = id
        states[#states + 1] = TASK_DONE
      else
        classify(id, redis.call('HGET', run, call_claim(step, id)))
      end
    end
  else
    classify('', redis.call('HGET', run, F_RUNNING))
  end
  return states, next_live, expired, unclaimed
end
-- Whether a run parked for approval (or for its subagents) is being resumed: a decide delivery
-- holds (or held) its phase claim, a decision or a cancel is stored for the decide to act on, or
-- (parked for its subagents) its last child ended at this version (record_child.lua).
-- The resume is then a phase like any other, watched by the sweeper; otherwise nothing is owed.
local function parked_resuming(run)
  local owed = redis.call('HMGET', run, F_RUNNING, F_DECISION, F_CANCEL, F_CHILDREN_ENDED, F_VERSION)
  return owed[1] ~= false or owed[2] ~= false or owed[3] ~= false or (owed[4] ~= false and owed[4] == owed[5])
end
local function split_calls(calls)
  local out = {}
  if calls and calls ~= '' then
    for id in string.gmatch(calls, '[^,]+') do out[#out + 1] = id end
  end
  return out
end
"""


def _definitions() -> list[tuple[str, str]]:
    """The prelude as (name, Lua source) definitions, each after those it uses."""
    defs = [(name, f"local {name} = '{value}'") for name, value in (_FIELDS | _VALUES).items()]
    defs += [(f"P_{p.name}", f"local P_{p.name} = '{p.value}'") for p in Phase]
    terminal = ", ".join(f"[P_{p.name}] = true" for p in sorted(TERMINAL_PHASES, key=lambda p: p.value))
    defs.append(("TERMINAL", f"local TERMINAL = {{{terminal}}}"))
    # A helper starts at a top-level comment or local line once the previous one is complete; its
    # comment lines belong to it.
    block: list[str] = []
    for line in _HELPERS.strip("\n").split("\n"):
        if block and line.startswith(("--", "local ")) and not block[-1].startswith("--"):
            defs.append(_helper(block))
            block = []
        block.append(line)
    defs.append(_helper(block))
    return defs


def _helper(lines: list[str]) -> tuple[str, str]:
    found = next(m for line in lines if (m := re.match(r"local (?:function )?(\w+)", line)))
    return found.group(1), "\n".join(lines)


def lua_prelude(body: str | None = None) -> str:
    """Field names, phase names and claim helpers, to prepend to a script's ``body``.

    With ``body``, only the definitions it uses (and those they use) are in it: Redis runs the
    prelude at every call of the script, and each helper it defines is a closure created anew each
    time, so a script pays only for what it uses. Without, the whole prelude.
    """
    defs = _definitions()
    if body is None:
        return "\n".join(source for _, source in defs) + "\n"
    used = _words(body)
    wanted: set[str] = set()
    for name, source in reversed(defs):  # each definition comes after what it uses
        if name in used:
            wanted.add(name)
            used |= _words(source)
    return "".join(source + "\n" for name, source in defs if name in wanted)


def _words(source: str) -> set[str]:
    return set(re.findall(r"\w+", source))
