"""Retention in the archive: archived runs deleted once their tenant's retention ran out, audited.

Every tenant's archived runs are kept ``Settings.archive_retention_days`` after they ended (0, the
default, keeps them forever); a tenant may have its own number of days
(:meth:`~shared.tenants.Tenants.set_archive_retention`, 0 for forever). Each deleted run leaves a
:class:`~shared.archive.record.Deletion` (run, tenant, agent, status, times, reason), written in
the same transaction as the deletion, so no run disappears without a record of it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from shared.archive.base import Archive
from shared.tenants import Tenants

__all__ = ["ArchivePruner", "PruneReport"]

_DAY_S = 86_400.0
#: Runs a dry run counts at most per retention scope.
_DRY_RUN_MAX = 1_000_000


@dataclass
class PruneReport:
    """What one pass deleted (or would, in a dry run), per tenant (``-``: runs without a tenant)."""

    dry_run: bool
    deleted: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class ArchivePruner:
    """Deletes archived runs past their retention, in batches, each deletion audited."""

    def __init__(self, archive: Archive, tenants: Tenants, default_days: float, batch: int = 500) -> None:
        self.archive = archive
        self.tenants = tenants
        self.default_days = default_days
        self.batch = batch

    def prune(
        self, *, dry_run: bool = False, now: float | None = None, max_runs: int | None = None
    ) -> PruneReport:
        started = time.monotonic()
        report = PruneReport(dry_run=dry_run)
        now = time.time() if now is None else now
        overrides = self.tenants.archive_retention()
        scopes: list[tuple[str | None, float, list[str]]] = [
            (tenant, days, []) for tenant, days in sorted(overrides.items()) if days > 0
        ]
        if self.default_days > 0:  # every tenant without its own retention
            scopes.append((None, self.default_days, sorted(overrides)))
        for tenant, days, exclude in scopes:
            before = now - days * _DAY_S
            reason = f"retention: {days:g} days"
            while max_runs is None or report.deleted < max_runs:
                left = _DRY_RUN_MAX if max_runs is None else max_runs - report.deleted
                limit = left if dry_run else min(self.batch, left)
                expired = self.archive.expired(before, limit, tenant=tenant, exclude=exclude)
                if not expired:
                    break
                for _, name in expired:
                    report.by_tenant[name] = report.by_tenant.get(name, 0) + 1
                if dry_run:
                    report.deleted += len(expired)
                    break
                report.deleted += self.archive.delete([run_id for run_id, _ in expired], reason)
        report.seconds = round(time.monotonic() - started, 3)
        return report
