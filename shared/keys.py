"""Every Redis key of the run state, in one place, under one configurable prefix.

Runs are spread over a fixed number of *shards*. Every key of a run, and the lease set and run
index of its shard, carry the shard's hash tag (``{s7}``), so each Lua script touches keys of a
single Redis Cluster slot. The shard of a run is a stable hash of its id; the number of shards is
part of the key layout and must not change while runs live (``Settings.shards``).

Evals, pipeline runs and the worker registry are not sharded: every key of all evals shares the
hash tag ``{evals}``, of all pipeline runs ``{pipes}``, of the registry ``{workers}``, so that each
of their scripts, which keep a per-eval (per-pipeline, per-worker) key and the set of all of them
together, touches one slot. Their traffic is a few commands per case run, child run or heartbeat;
the runs they start are sharded like any other.

Retention: a terminal run's per-run keys get ``Settings.retention_s`` as TTL when it ends; the
run indexes are trimmed by the sweeper.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

__all__ = ["Keys", "RunKeys", "names_another_runs_key"]

#: Runs whose key names a :class:`Keys` keeps (past it, it starts over). Few: a process sees again
#: the runs it works on now, and a run it must build again costs one shard hash, not one a name.
_CACHED_RUNS = 64


@dataclass(frozen=True, slots=True)
class RunKeys:
    """The key names of one run that its claims, commits and renewals use (see :class:`Keys`)."""

    #: The shard's hash tag with the prefix (``wesichain:{s7}:``): the shard's own keys follow it.
    tag: str
    run: str
    messages: str
    checkpoints: str
    events: str
    inbox: str
    attempts: str
    leases: str
    indexes: str
    inflight: str
    ended: str

    def results(self, step: int) -> str:
        return f"{self.run}:step:{step}:results"

    def last_claim(self, holder: str) -> str:
        return _last_claim(self.tag, holder)

    def index(self, tenant: str | None, dimension: str = "all", value: str = "") -> str:
        return _index(self.tag, tenant, dimension, value)


def _last_claim(tag: str, holder: str) -> str:
    return f"{tag}last-claim:{holder}"


#: The tails :meth:`Keys.of` adds to a run's key to name its other keys. Run ids may hold ``:``,
#: so an id ending in one of them (``X:inbox``) would name run X's key: reading it as a run is a
#: Redis type error, and creating it would take the key run X writes later.
_OTHER_KEY_TAIL = re.compile(r":(?:messages|checkpoints|events|inbox|attempts|step:[0-9]+:results)\Z")


def names_another_runs_key(run_id: str) -> bool:
    """Whether ``run_id``'s key would be one of another run's keys (no run may have such an id)."""
    return _OTHER_KEY_TAIL.search(run_id) is not None


def _owner(tenant: str | None) -> str:
    """A tenant's part of a key that more names follow (``-``: runs without one). It holds no ``:``
    (escaped as ``%3A``; no name holds ``%``), so the first ``:`` after it ends it: tenant ``a``
    with thread ``b:c`` and tenant ``a:b`` with thread ``c`` name two keys, not one both tenants
    would read and write."""
    return "-" if tenant is None else tenant.replace(":", "%3A")


def _index(tag: str, tenant: str | None, dimension: str, value: str) -> str:
    # The tenant escaped: tenant ``org`` listing thread ``eu:all:`` must not name the index of
    # tenant ``org:eu``'s runs, which the first could otherwise fill with ids of its own.
    return f"{tag}idx:{_owner(tenant)}:{dimension}:{value}"


@dataclass(frozen=True)
class Keys:
    """The key names of one deployment (its prefix and number of shards)."""

    prefix: str = "wesichain:"
    shards: int = 16
    #: :meth:`of` by run id: every phase of a run builds the same dozen names again otherwise.
    _runs: dict[str, RunKeys] = field(default_factory=dict, init=False, repr=False, compare=False)

    def shard(self, run_id: str) -> int:
        return zlib.crc32(run_id.encode()) % self.shards

    def _tag(self, shard: int) -> str:
        return f"{self.prefix}{{s{shard}}}:"

    def of(self, run_id: str) -> RunKeys:
        """The key names of ``run_id``'s own keys and of its shard's (built once per run)."""
        found = self._runs.get(run_id)
        if found is None:
            tag = self._tag(self.shard(run_id))
            run = f"{tag}run:{run_id}"
            found = RunKeys(
                tag=tag,
                run=run,
                messages=run + ":messages",
                checkpoints=run + ":checkpoints",
                events=run + ":events",
                inbox=run + ":inbox",
                attempts=run + ":attempts",
                leases=tag + "leases",
                indexes=tag + "indexes",
                inflight=tag + "inflight",
                ended=tag + "ended",
            )
            if len(self._runs) >= _CACHED_RUNS:
                self._runs.clear()
            self._runs[run_id] = found
        return found

    def run(self, run_id: str) -> str:
        """Hash: the run's head and claims (field names in :mod:`shared.protocol`)."""
        return self.of(run_id).run

    def messages(self, run_id: str) -> str:
        """List: the conversation, append-only (RPUSH), so a commit never rewrites history."""
        return self.of(run_id).messages

    def checkpoints(self, run_id: str) -> str:
        """List: the body of every committed head, in version order (index = version - 1)."""
        return self.of(run_id).checkpoints

    def events(self, run_id: str) -> str:
        """Stream: the run's typed events, capped with MAXLEN."""
        return self.of(run_id).events

    def results(self, run_id: str, step: int) -> str:
        """Hash: call_id -> tool result JSON for one step; HSETNX makes each result once."""
        return self.of(run_id).results(step)

    def inbox(self, run_id: str) -> str:
        """Hash: the signals sent into the run (by sequence number), their client keys and their
        outcomes (field names in :mod:`shared.protocol`, ``INBOX_*``)."""
        return self.of(run_id).inbox

    def attempts(self, run_id: str) -> str:
        """Hash: claims per piece of work and version, last errors, lost publishes (poison detection)."""
        return self.of(run_id).attempts

    def leases(self, shard: int) -> str:
        """Sorted set: run ids of the shard, scored by the Redis time (ms) the sweeper must look at them."""
        return self._tag(shard) + "leases"

    def leases_of(self, run_id: str) -> str:
        return self.of(run_id).leases

    def last_claim(self, shard: int, holder: str) -> str:
        """String (expiring with the claim's lease): the last claim one process (``host:pid``) took
        on a run of this shard, written by the claim itself, so that a worker killed right after a
        claim has it handed on without its main process having listed it (``shared/liveness.py``)."""
        return _last_claim(self._tag(shard), holder)

    def last_claim_of(self, run_id: str, holder: str) -> str:
        return self.of(run_id).last_claim(holder)

    def runs_index(self, shard: int) -> str:
        """Sorted set: run ids of the shard scored by creation time (ms), for listing."""
        return self._tag(shard) + "runs"

    def runs_index_of(self, run_id: str) -> str:
        return self.runs_index(self.shard(run_id))

    def index(self, shard: int, tenant: str | None, dimension: str = "all", value: str = "") -> str:
        """Sorted set: run ids of one tenant in the shard, by creation time (ms), for listing.

        ``dimension`` narrows it: ``all``, or ``agent``, ``status``, ``thread`` with ``value``.
        The commit scripts keep them (a run's status index moves with the run).
        """
        return _index(self._tag(shard), tenant, dimension, value)

    def index_of(self, run_id: str, tenant: str | None, dimension: str = "all", value: str = "") -> str:
        return self.of(run_id).index(tenant, dimension, value)

    def ended(self, shard: int) -> str:
        """Sorted set: ended runs of the shard still in Redis, scored by when they ended (Redis ms).

        The commit script enters a run when it ends; the archiver takes runs from it oldest first
        and removes them with their keys (gc drops entries of runs that expired instead).
        """
        return self._tag(shard) + "ended"

    def ended_of(self, run_id: str) -> str:
        return self.of(run_id).ended

    def indexes(self, shard: int) -> str:
        """Set: every index key of the shard (the sweeper trims them past the retention)."""
        return self._tag(shard) + "indexes"

    def indexes_of(self, run_id: str) -> str:
        return self.of(run_id).indexes

    def sync(self, shard: int) -> str:
        """String: written just before a replication wait on the shard's primary (its value: the
        last run waited for), so that the wait covers every earlier write of the shard."""
        return self._tag(shard) + "sync"

    def sync_of(self, run_id: str) -> str:
        return self.sync(self.shard(run_id))

    def memory(self, tenant: str | None, part: str) -> str:
        """One part of a tenant's long-term memory (``shared/memory.py``): every part of one tenant
        shares the hash tag ``{m:<tenant>}``, so its scripts touch one slot (tenant names hold no
        braces; ``~``, which no tenant name holds, stands for runs without a tenant)."""
        return f"{self.prefix}{{m:{tenant or '~'}}}:memory:{part}"

    def inflight(self, shard: int) -> str:
        """Hash: tenant -> runs of the shard not ended yet (summed over the shards for limits)."""
        return self._tag(shard) + "inflight"

    def inflight_of(self, run_id: str) -> str:
        return self.of(run_id).inflight

    def tenant(self, name: str) -> str:
        """Hash: a tenant's settings (webhook secret, default callback, limits)."""
        return f"{self.prefix}tenant:{name}"

    def submits(self, tenant: str) -> str:
        """Sorted set: the tenant's submits of the last minute (its submits-per-minute limit)."""
        return f"{self.prefix}tenant:{tenant}:submits"

    def tenants(self) -> str:
        """Set: every tenant's name."""
        return f"{self.prefix}tenants"

    def archive_retention(self) -> str:
        """Hash: tenant -> days its archived runs are kept after they ended (0: forever)."""
        return f"{self.prefix}archive:retention"

    def api_key(self, digest: str) -> str:
        """String: an API key's record (tenant, name, when), under the SHA-256 of the key."""
        return f"{self.prefix}apikey:{digest}"

    def api_keys(self, tenant: str) -> str:
        """Set: the digests of a tenant's API keys."""
        return f"{self.prefix}tenant:{tenant}:keys"

    def rate(self, tenant: str) -> str:
        """Hash: a tenant's submit rate bucket (tokens, last refill)."""
        return f"{self.prefix}tenant:{tenant}:rate"

    def archiver_lock(self, shard: int) -> str:
        """String: the token of the archiver currently moving the shard's ended runs (expires with it)."""
        return self._tag(shard) + "archiver:lock"

    def sweeper_lock(self) -> str:
        """String: the token of the sweeper currently allowed to sweep (expires with it)."""
        return f"{self.prefix}sweeper:lock"

    def sweeper_seen(self) -> str:
        """String: the Redis time (ms) at which a sweeper last reached Redis (``sweep_watch.lua``)."""
        return f"{self.prefix}{{sweeper}}:seen"

    def sweeper_quiet(self) -> str:
        """String, expiring: while it exists, sweepers judge no claim expired and no worker dead
        (Redis was out of every sweeper's reach: its holders could not renew meanwhile)."""
        return f"{self.prefix}{{sweeper}}:quiet"

    def limit(self, scope: str) -> str:
        """Hash: one provider limit's buckets and back-off (``scope``: provider:model[@tenant]).

        Expires two minutes after its last use (the buckets are full again by then). The scope is
        the hash tag, so a limit's two keys share a Redis Cluster slot.
        """
        return f"{self.prefix}{{limit:{scope}}}:state"

    def limit_slots(self, scope: str) -> str:
        """Sorted set: holders of a provider limit's concurrent calls, by lease deadline (Redis ms)."""
        return f"{self.prefix}{{limit:{scope}}}:slots"

    def _thread(self, tenant: str | None, thread_id: str) -> str:
        # Every key of one thread shares its hash tag: each thread script touches one slot.
        return f"{self.prefix}{{thread:{_owner(tenant)}:{thread_id}}}"

    def thread(self, tenant: str | None, thread_id: str) -> str:
        """List: run ids of one conversation thread of one tenant, oldest first (the thread order)."""
        return self._thread(tenant, thread_id)

    def thread_state(self, tenant: str | None, thread_id: str) -> str:
        """Hash: the run holding the thread and since when (fields in :mod:`shared.protocol`)."""
        return self._thread(tenant, thread_id) + ":state"

    def thread_waiting(self, tenant: str | None, thread_id: str) -> str:
        """List: run ids waiting for the thread, in thread order (each starts when the one before ends)."""
        return self._thread(tenant, thread_id) + ":waiting"

    def thread_rolled_back(self, tenant: str | None, thread_id: str) -> str:
        """Set: runs of the thread rolled back (``rollback``): later runs' history skips them."""
        return self._thread(tenant, thread_id) + ":rolled_back"

    def threads_held(self) -> str:
        """Sorted set: the threads some run may hold (JSON ``[tenant, thread_id]``), scored by a
        change counter: the sweeper's backstop for a thread whose hand-on was lost."""
        return f"{self.prefix}{{threads}}:held"

    def workers(self) -> str:
        """Sorted set: worker ids scored by their last heartbeat (Redis time, ms)."""
        return f"{self.prefix}{{workers}}"

    def worker(self, worker_id: str) -> str:
        """String: one worker's JSON record (what it serves, whether it consumes); expires with it."""
        return f"{self.prefix}{{workers}}:{worker_id}"

    def pinned(self, agent: str, version: str) -> str:
        """Set: ids of the runs pinned to ``agent`` ``version`` (``shared/versions.py``), added
        before the commit that pins them; an ended or re-pinned run is dropped when it is read."""
        return f"{self.prefix}{{workers}}:pinned:{agent}:{version}"

    def pinned_of(self, agent: str, version: str, tenant: str | None) -> str:
        """Set: the runs of one tenant (``-``: none) pinned to ``agent`` ``version``, kept beside
        :meth:`pinned` so a tenant's count reads its own runs only."""
        return f"{self.prefix}{{workers}}:pinned-of:{_owner(tenant)}:{agent}:{version}"

    def pinned_versions(self) -> str:
        """Set: ``AGENT:VERSION`` of every version some live run may be pinned to."""
        return f"{self.prefix}{{workers}}:pinned"

    def drains(self) -> str:
        """Hash: what operators asked to drain (``worker:ID`` or ``version:AGENT:N``) -> when (s)."""
        return f"{self.prefix}{{workers}}:drains"

    def worker_deaths(self) -> str:
        """Sorted set: worker starts the sweeper found dead (JSON, ``shared/pool_records.py``), scored by
        the Redis time (ms) their liveness ran out; bounded in number and age."""
        return f"{self.prefix}{{workers}}:deaths"

    def ends_per_minute(self, minute_s: int) -> str:
        """Hash: runs that ended in the minute starting at ``minute_s`` (Unix seconds), by status,
        for the pool and per tenant (``shared/pool_records.py``); expires a day later."""
        return f"{self.prefix}{{pool}}:ends:{minute_s}"

    def lives(self) -> str:
        """Sorted set: each running worker process (its main process, one entry per start) scored by
        the Redis time (ms) until which it is alive unless it beats again (``shared/liveness.py``)."""
        return f"{self.prefix}{{workers}}:lives"

    def held(self, life: str) -> str:
        """String: the claims the pool of one worker start (a member of :meth:`lives`) works on."""
        return f"{self.prefix}{{workers}}:held:{life}"

    # -- assistants: every key of one tenant's assistants shares the tenant's hash tag -----------

    def assistant_versions(self, tenant: str | None, name: str) -> str:
        """List: one assistant's versions as JSON, oldest first (index = version - 1), append-only."""
        return f"{self.prefix}{{asst:{tenant or '-'}}}:{name}:versions"

    def assistants(self, tenant: str | None) -> str:
        """Sorted set: the names of a tenant's assistants (score 0, in name order)."""
        return f"{self.prefix}{{asst:{tenant or '-'}}}:index"

    def assistant_sizes(self, tenant: str | None) -> str:
        """Hash: the bytes each of a tenant's assistants' versions hold (deleted ones' until they
        expire), and their total under ``*total``: what ``max_assistant_bytes`` bounds."""
        return f"{self.prefix}{{asst:{tenant or '-'}}}:sizes"

    def assistants_kept(self, tenant: str | None) -> str:
        """Sorted set: a tenant's deleted assistants whose versions are kept, scored by when (ms)
        they expire and stop counting against its quota."""
        return f"{self.prefix}{{asst:{tenant or '-'}}}:kept"

    # -- evals: every key of every eval shares one hash tag, so each eval script touches one slot --

    def _eval(self, eval_id: str) -> str:
        return f"{self.prefix}{{evals}}:{eval_id}"

    def eval_meta(self, eval_id: str) -> str:
        """Hash: the eval's spec, status, item count and times (no TTL until it ends)."""
        return self._eval(eval_id) + ":meta"

    def eval_cases(self, eval_id: str) -> str:
        """Hash: case index -> the case as JSON."""
        return self._eval(eval_id) + ":cases"

    def eval_pending(self, eval_id: str) -> str:
        """List: work items (``variant:case:repeat`` indexes) not started yet, next first."""
        return self._eval(eval_id) + ":pending"

    def eval_slots(self, eval_id: str) -> str:
        """Sorted set: items holding a slot of the eval's cap, by lease deadline (Redis ms; inf once
        the case run exists, released when its result is recorded)."""
        return self._eval(eval_id) + ":slots"

    def eval_scoring(self, eval_id: str) -> str:
        """Sorted set: items being scored, by the deadline of the scorer's claim (Redis ms)."""
        return self._eval(eval_id) + ":scoring"

    def eval_results(self, eval_id: str) -> str:
        """Hash: item -> its result row as JSON; HSETNX makes each result once."""
        return self._eval(eval_id) + ":results"

    def eval_annotations(self, tenant: str | None, eval_id: str) -> str:
        """Hash: item -> the latest human annotation of that case run (JSON), of one tenant's eval."""
        return f"{self.prefix}{{evals}}:ann:{tenant or '-'}:{eval_id}"

    def eval_annotation_log(self, tenant: str | None, eval_id: str) -> str:
        """List: every annotation of one tenant's eval, oldest first (who marked what, and when)."""
        return f"{self.prefix}{{evals}}:annlog:{tenant or '-'}:{eval_id}"

    def eval_counts(self, eval_id: str) -> str:
        """Hash: running totals per variant (``v<n>:done``, ``passed``, ``failed``, tokens, cost)."""
        return self._eval(eval_id) + ":counts"

    def evals_active(self) -> str:
        """Set: ids of evals not finished (the sweeper looks after them)."""
        return f"{self.prefix}{{evals}}active"

    def evals_index(self) -> str:
        """Sorted set: every eval id by creation time (ms)."""
        return f"{self.prefix}{{evals}}index"

    def evals_index_of(self, tenant: str | None) -> str:
        """Sorted set: one tenant's eval ids by creation time (ms; ``-``: the operator's), what its
        listing reads: another tenant's evals, however many, neither crowd its own out nor show."""
        return f"{self.prefix}{{evals}}index-of:{_owner(tenant)}"

    # -- pipeline runs: every key of all of them shares one hash tag (one slot per script) --

    def _pipe(self, pipeline_id: str) -> str:
        return f"{self.prefix}{{pipes}}:{pipeline_id}"

    def pipe_meta(self, pipeline_id: str) -> str:
        """Hash: a pipeline run's request, status, current step and its counters, output or error."""
        return self._pipe(pipeline_id) + ":meta"

    def pipe_steps(self, pipeline_id: str) -> str:
        """Hash: step number -> what that step was (name, kind, agent, items), as JSON."""
        return self._pipe(pipeline_id) + ":steps"

    def pipe_items(self, pipeline_id: str, seq: int) -> str:
        """Hash: item index -> the input text of its child run, for step ``seq``."""
        return f"{self._pipe(pipeline_id)}:items:{seq}"

    def pipe_attempts(self, pipeline_id: str, seq: int) -> str:
        """Hash: item index -> its current attempt (absent: 0); a retry moves it on once."""
        return f"{self._pipe(pipeline_id)}:attempts:{seq}"

    def pipe_children(self, pipeline_id: str, seq: int) -> str:
        """Hash: item index -> the run id of the child run created for its current attempt."""
        return f"{self._pipe(pipeline_id)}:children:{seq}"

    def pipe_results(self, pipeline_id: str, seq: int) -> str:
        """Hash: item index -> how its child ended, as JSON; HSETNX records each item once."""
        return f"{self._pipe(pipeline_id)}:results:{seq}"

    def pipe_pump(self, pipeline_id: str, seq: int) -> str:
        """String with a short expiry: the token of the pump taking step ``seq``'s items now, which
        takes the room that ends give back meanwhile (``pipe_record.lua``, ``pipe_mark.lua``)."""
        return f"{self._pipe(pipeline_id)}:pump:{seq}"

    def pipe_events(self, pipeline_id: str) -> str:
        """Stream: the pipeline run's events (steps, each child's start and end, its own end)."""
        return self._pipe(pipeline_id) + ":events"

    def pipes_active(self) -> str:
        """Set: ids of pipeline runs the sweeper looks after (running, or ended with live children)."""
        return f"{self.prefix}{{pipes}}active"

    def pipes_index(self) -> str:
        """Sorted set: every pipeline run id by creation time (ms)."""
        return f"{self.prefix}{{pipes}}index"

    def pipes_index_of(self, tenant: str | None) -> str:
        """Sorted set: one tenant's pipeline run ids by creation time (ms; ``-``: no tenant), what
        listings read; entries past the retention are dropped as new ones come in."""
        return f"{self.prefix}{{pipes}}index:{tenant or '-'}"

    # -- bulk jobs: every key of all of them shares one hash tag (one slot per script) ---------

    def _bulk(self, tenant: str | None, job_id: str) -> str:
        # The tenant is part of the name: another tenant's lookup of the same id finds nothing.
        return f"{self.prefix}{{bulk}}:{tenant or '-'}:{job_id}"

    def bulk_job(self, tenant: str | None, job_id: str) -> str:
        """Hash: a bulk job's spec, status, cursor and counters (``shared/bulk.py``)."""
        return self._bulk(tenant, job_id) + ":job"

    def bulk_outcomes(self, tenant: str | None, job_id: str) -> str:
        """Hash: run id -> what the job did to it, as JSON; HSETNX records each run once."""
        return self._bulk(tenant, job_id) + ":outcomes"

    def bulk_lock(self, tenant: str | None, job_id: str) -> str:
        """String: the token of the delivery working on the job, with a lease."""
        return self._bulk(tenant, job_id) + ":lock"

    def bulk_index(self, tenant: str | None) -> str:
        """Sorted set: one tenant's bulk job ids by creation time (ms)."""
        return f"{self.prefix}{{bulk}}index:{tenant or '-'}"

    def bulk_active(self) -> str:
        """Set: ``[tenant, job id]`` (JSON) of the jobs still running (the sweeper looks after them)."""
        return f"{self.prefix}{{bulk}}active"

    # -- schedules: every key of all of them shares one hash tag (one slot per script) ----------

    def _sched(self, tenant: str | None, schedule_id: str) -> str:
        # Tenant first: a schedule is found only with its own tenant.
        return f"{self.prefix}{{sched}}:{tenant or '-'}:{schedule_id}"

    def sched(self, tenant: str | None, schedule_id: str) -> str:
        """Hash: a schedule's spec, next tick, paused flag, counters (``shared/schedules.py``)."""
        return self._sched(tenant, schedule_id)

    def sched_history(self, tenant: str | None, schedule_id: str) -> str:
        """List: what the schedule's newest ticks came to, oldest first (bounded)."""
        return self._sched(tenant, schedule_id) + ":history"

    def sched_index(self, tenant: str | None) -> str:
        """Sorted set: one tenant's schedule ids by creation time (ms)."""
        return f"{self.prefix}{{sched}}index:{tenant or '-'}"

    def sched_due(self) -> str:
        """Sorted set: ``[tenant, schedule id]`` of every unpaused schedule, by its next tick (s)."""
        return f"{self.prefix}{{sched}}due"
