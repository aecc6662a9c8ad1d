"""``wesichain runs search`` and ``wesichain bulk``: find runs, and act on every run a search finds.

Straight to the run state's Redis (and the archive, when configured) as an operator does,
``--tenant`` naming whose runs (none: runs started without a tenant); or with ``--api`` (or
``$WESICHAIN_API_URL``) through the HTTP API (``POST /v1/runs/search``, ``/v1/bulk``) as the key's
tenant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from producer.api_client import ApiClient
from producer.client import Client
from producer.commands import over_api
from shared.bulk import BULK_ACTIONS, DEFAULT_RATE_PER_S, BulkJob
from shared.errors import InvalidRequest
from shared.search import SearchQuery
from shared.state import RUN_STATUSES, RunHead
from shared.wire import RunView

__all__ = [
    "Handler",
    "bulk_command",
    "register",
    "search_runs",
]

Handler = Callable[[argparse.Namespace], int]
#: The fields ``runs search --json`` prints of each run.
_LISTED = {"run_id", "agent", "agent_version", "phase", "created_at", "metadata"}


def _where(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--tenant", help=f"without --api: whose {what} (default: {what} without a tenant)")
    parser.add_argument("--api", metavar="URL", help="use the HTTP API at URL (default $WESICHAIN_API_URL)")
    parser.add_argument("--key", metavar="KEY", help="the API key (default $WESICHAIN_API_KEY)")


def _api(args: argparse.Namespace) -> ApiClient | None:
    api = over_api(args)
    if api is not None and args.tenant:
        raise InvalidRequest("--tenant is for Redis: over the API the key's tenant is the one")
    return api


def _filters(parser: argparse.ArgumentParser) -> None:
    _where(parser, "runs")
    parser.add_argument("--agent", help="the agent the run was started for")
    parser.add_argument("--version", dest="agent_version", help="the agent version the run is pinned to")
    parser.add_argument("--status", choices=RUN_STATUSES, help="the run's status (queued, running, ...)")
    parser.add_argument("--error-kind", help="a failed run's error kind (ModelTransport, ToolDispatch...)")
    parser.add_argument("--thread", help="the conversation thread id")
    parser.add_argument("--since", type=float, help="created at or after (Unix seconds)")
    parser.add_argument("--until", type=float, help="created before (Unix seconds)")
    parser.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a declared metadata key and its value (WESICHAIN_SEARCH_ATTRIBUTES); repeatable",
    )


def _query(args: argparse.Namespace) -> SearchQuery:
    metadata: dict[str, str] = {}
    for pair in args.meta:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidRequest(f"--meta takes KEY=VALUE, got {pair[:80]!r}")
        metadata[key] = value
    filters = {
        "agent": args.agent,
        "version": args.agent_version,
        "status": args.status,
        "error_kind": args.error_kind,
        "thread_id": args.thread,
        "since": args.since,
        "until": args.until,
        "metadata": metadata,
    }
    try:
        return SearchQuery.model_validate({k: v for k, v in filters.items() if v is not None})
    except ValueError as exc:
        raise InvalidRequest(f"bad search: {exc}"[:500]) from None


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    runs = sub.add_parser("runs", parents=[common], help="search runs (live and archived)")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    search = runs_sub.add_parser("search", parents=[common], help="runs matching filters, newest first")
    _filters(search)
    search.add_argument("--limit", type=int, default=50, help="runs per page (1..500)")
    search.add_argument("--cursor", help="continue after the page that printed this cursor")
    search.add_argument("--json", action="store_true", help="one JSON object per run, then the cursor")

    bulk = sub.add_parser("bulk", parents=[common], help="retry, fork or cancel every run a search finds")
    bulk_sub = bulk.add_subparsers(dest="bulk_command", required=True)
    for action, text in (
        ("retry", "a fresh run with the same request, for each ended run"),
        ("fork", "a new run from the last checkpoint before each ended run ended"),
        ("cancel", "cancel each run not ended yet"),
    ):
        b = bulk_sub.add_parser(action, parents=[common], help=text)
        _filters(b)
        b.add_argument("--rate", type=float, default=DEFAULT_RATE_PER_S, help="runs acted on per second")
        b.add_argument("--wait", action="store_true", help="print its progress until it ends")
        b.add_argument("--json", action="store_true", help="print the job as JSON")
    for verb, text in (("status", "a bulk job's progress"), ("stop", "stop a running bulk job")):
        b = bulk_sub.add_parser(verb, parents=[common], help=text)
        b.add_argument("job_id")
        _where(b, "jobs")
        b.add_argument("--json", action="store_true", help="print the job as JSON")
    _where(bulk_sub.add_parser("list", parents=[common], help="bulk jobs, newest first"), "jobs")
    return {"runs": search_runs, "bulk": bulk_command}


def search_runs(args: argparse.Namespace) -> int:
    api = _api(args)
    runs: list[RunHead] | list[RunView]
    if api is not None:
        page = api.search(_query(args), cursor=args.cursor, limit=args.limit)
        runs, next_cursor = page.runs, page.next_cursor
    else:
        found = Client.from_env().search(
            _query(args), tenant=args.tenant, cursor=args.cursor, limit=args.limit
        )
        runs, next_cursor = found.runs, found.next_cursor
    for head in runs:
        if args.json:
            print(head.model_dump_json(include=_LISTED))
        else:
            error = f" {head.error.kind}" if head.error is not None else ""
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(head.created_at))
            print(f"{head.run_id}  {stamp}  {head.agent}@{head.agent_version or '-'}  {head.status}{error}")
    if args.json:
        print(json.dumps({"next_cursor": next_cursor}))
    elif next_cursor is not None:
        print(f"more: --cursor {next_cursor}", file=sys.stderr)
    return 0


def _show(job: BulkJob, as_json: bool) -> None:
    if as_json:
        print(job.model_dump_json())
        return
    print(
        f"bulk {job.action} {job.job_id}: {job.status}, {job.acted} acted, {job.skipped} skipped,"
        f" {job.failed} failed"
    )


class _Jobs:
    """The bulk job calls the commands make, on Redis (as ``tenant``) or over the API."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.api = _api(args)
        self.redis = Client.from_env() if self.api is None else None
        self.tenant: str | None = args.tenant

    def start(self, action: str, query: SearchQuery, rate_per_s: float) -> BulkJob:
        if self.api is not None:
            return self.api.bulk(action, query, rate_per_s=rate_per_s)
        assert self.redis is not None
        return self.redis.bulk(action, query, tenant=self.tenant, rate_per_s=rate_per_s)

    def job(self, job_id: str) -> BulkJob:
        if self.api is not None:
            return self.api.bulk_job(job_id)
        assert self.redis is not None
        return self.redis.bulk_job(job_id, tenant=self.tenant)

    def jobs(self) -> list[BulkJob]:
        if self.api is not None:
            return self.api.bulk_jobs()
        assert self.redis is not None
        return self.redis.bulk_jobs(tenant=self.tenant)

    def cancel(self, job_id: str) -> BulkJob:
        if self.api is not None:
            return self.api.cancel_bulk(job_id)
        assert self.redis is not None
        return self.redis.cancel_bulk(job_id, tenant=self.tenant)


def bulk_command(args: argparse.Namespace) -> int:
    jobs = _Jobs(args)
    command = args.bulk_command
    if command in BULK_ACTIONS:
        job = jobs.start(command, _query(args), args.rate)
        _show(job, args.json)
        while args.wait and job.status == "running":
            time.sleep(1.0)
            job = jobs.job(job.job_id)
            _show(job, args.json)
        return 0
    if command == "list":
        for job in jobs.jobs():
            _show(job, False)
        return 0
    job = jobs.job(args.job_id)
    if command == "stop" and job.status == "running":
        job = jobs.cancel(args.job_id)
    _show(job, args.json)
    return 0
