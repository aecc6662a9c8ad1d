"""Every Redis key the runtime uses, in one place, under one configurable prefix.

Keys of one run share the ``{run_id}`` hash tag so that every Lua script touches a single
Redis Cluster slot. Retention: a terminal run's keys get ``Settings.retention_s`` as TTL when it
ends; the global sets are trimmed by the sweeper.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "wesichain:"

    def run(self, run_id: str) -> str:
        """Hash: the run's head (phase, step, version, epoch, body JSON, outbox, cancel flag)."""
        return f"{self.prefix}run:{{{run_id}}}"

    def messages(self, run_id: str) -> str:
        """List: the conversation, append-only (RPUSH), so a commit never rewrites history."""
        return f"{self.prefix}run:{{{run_id}}}:messages"

    def checkpoints(self, run_id: str) -> str:
        """List: every committed head, in version order (index = version - 1)."""
        return f"{self.prefix}run:{{{run_id}}}:checkpoints"

    def events(self, run_id: str) -> str:
        """Stream: the run's typed events, capped with MAXLEN."""
        return f"{self.prefix}run:{{{run_id}}}:events"

    def results(self, run_id: str, step: int) -> str:
        """Hash: call_id -> tool result JSON for one step; HSETNX makes each result once."""
        return f"{self.prefix}run:{{{run_id}}}:step:{step}:results"

    def attempts(self, run_id: str) -> str:
        """Hash: "<step>:<phase>[:<call_id>]" -> deliveries that started work (poison detection)."""
        return f"{self.prefix}run:{{{run_id}}}:attempts"

    def leases(self) -> str:
        """Sorted set: "<run_id>" scored by the lease deadline of the phase in flight."""
        return f"{self.prefix}leases"

    def runs_index(self) -> str:
        """Sorted set: run_id scored by creation time, for listing."""
        return f"{self.prefix}runs"

    def sweeper_lock(self) -> str:
        """String: the token of the sweeper currently allowed to sweep (expires with it)."""
        return f"{self.prefix}sweeper:lock"

    def fault(self, name: str, run_id: str) -> str:
        """String: set once a test-only fault point fired for a run (see ``worker/faults.py``)."""
        return f"{self.prefix}fault:{name}:{run_id}"

    def fault_pid(self, phase: str, run_id: str) -> str:
        """String: the pid a ``pause:<phase>`` fault point paused in (tests kill it)."""
        return f"{self.prefix}fault:pid:{phase}:{run_id}"

    def thread(self, thread_id: str) -> str:
        """List: run ids of one conversation thread, oldest first."""
        return f"{self.prefix}thread:{thread_id}"
