"""The worker's CLI commands (``worker``, ``sweeper``, ``demo``), added to ``wesichain`` through
the ``wesichain.commands`` entry point group."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from shared.queues import DEFAULT_NAMESPACE
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings

if TYPE_CHECKING:
    from producer.scheduler import Scheduler

#: What a worker consumes when told nothing: the pool's default queues.
DEFAULT_QUEUES = (QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS)

__all__ = [
    "DEFAULT_QUEUES",
    "Handler",
    "archive",
    "consumed_queues",
    "default_node_name",
    "archive_retention",
    "demo",
    "gc",
    "metrics",
    "prune",
    "register",
    "run_celery_worker",
    "sweeper",
    "worker",
]

Handler = Any


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    d = sub.add_parser(
        "demo", parents=[common], help="run the research assistant embedded: no server, no API key"
    )
    d.add_argument("question", nargs="?", help="what to ask")
    d.add_argument("--json", action="store_true", help="print events and the final state as JSON lines")
    d.add_argument("--model", help="override the agent's model (PROVIDER:MODEL)")
    d.add_argument(
        "--agent", default="research", help="the agent to ask (research-desk: a handoff to research)"
    )
    d.add_argument(
        "--tour",
        action="store_true",
        help="a conversation on one thread instead: a handoff, a message sent into a running run,"
        " and later questions under the enqueue and rollback thread policies",
    )

    w = sub.add_parser("worker", parents=[common], help="run a Celery worker for the phase tasks")
    w.add_argument(
        "--queues",
        "-Q",
        default=None,
        help=f"comma-separated queues to consume (default {','.join(DEFAULT_QUEUES)};"
        " none when --namespace is given)",
    )
    w.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NAME",
        help="consume the queues of the runs submitted with this queue namespace (NAME.model,"
        " NAME.tools, NAME.callbacks) instead of the default ones; repeatable, adds to --queues",
    )
    w.add_argument(
        "--pool",
        default="prefork",
        choices=["prefork", "threads", "solo"],
        help="Celery's pool: prefork for CPU-bound tools, threads for model phases (default prefork)",
    )
    w.add_argument(
        "--concurrency", "-c", type=int, default=None, help="pool processes or threads (default: CPU count)"
    )
    w.add_argument(
        "--name",
        "-n",
        default=None,
        help="worker node name, e.g. w1@%%h (default: its queues and pid, e.g. tools-4242@HOST)",
    )
    w.add_argument("--loglevel", "-l", default="INFO", help="log level (default INFO)")
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics of this worker (all its pool processes) on this port"
        " (default $WESICHAIN_METRICS_PORT; 0: none)",
    )
    w.add_argument("celery_args", nargs=argparse.REMAINDER, help="after --, passed to `celery worker` as is")

    sw = sub.add_parser("sweeper", parents=[common], help="run the recovery sweeper standalone")
    sw.add_argument("--once", action="store_true", help="sweep once and exit")
    sw.add_argument(
        "--schedules",
        action="store_true",
        help="also fire the schedules' due ticks, as `wesichain scheduler` does (default"
        " $WESICHAIN_SWEEPER_SCHEDULES; safe beside any number of schedulers)",
    )
    m = sub.add_parser(
        "metrics",
        parents=[common],
        help="serve the pool's state for Prometheus: queue depths, runs in flight and parked, leases",
    )
    m.add_argument("--port", type=int, default=9808, help="port to serve /metrics on (default 9808)")
    m.add_argument("--address", default="0.0.0.0", help="address to bind (default all)")
    g = sub.add_parser(
        "gc", parents=[common], help="report and remove what outlived the retention (indexes included)"
    )
    g.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    a = sub.add_parser(
        "archive",
        parents=[common],
        help="move ended runs from Redis to the archive ($WESICHAIN_ARCHIVE_URL), then exit",
    )
    a.add_argument(
        "--after",
        type=float,
        default=None,
        metavar="S",
        help="archive runs that ended at least S seconds ago (default $WESICHAIN_ARCHIVE_AFTER_S)",
    )
    a.add_argument("--max", type=int, default=None, metavar="N", help="move at most N runs")
    a.add_argument("--loop", action="store_true", help="keep archiving every $WESICHAIN_ARCHIVE_INTERVAL_S")
    a.add_argument("--json", action="store_true", help="print each pass's report as JSON")
    p = sub.add_parser(
        "prune",
        parents=[common],
        help="delete archived runs past their tenant's archive retention (each deletion audited)",
    )
    p.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    r = sub.add_parser(
        "archive-retention",
        parents=[common],
        help="show, or set a tenant's, days archived runs are kept after they ended (0: forever)",
    )
    r.add_argument("--tenant", help="the tenant to set (without it: show every tenant's)")
    days = r.add_mutually_exclusive_group()
    days.add_argument("--days", type=float, help="keep its runs this many days (0: forever)")
    days.add_argument(
        "--default", action="store_true", help="back to every tenant's ($WESICHAIN_ARCHIVE_RETENTION_DAYS)"
    )
    return {
        "prune": prune,
        "archive-retention": archive_retention,
        "demo": demo,
        "worker": worker,
        "sweeper": sweeper,
        "metrics": metrics,
        "gc": gc,
        "archive": archive,
    }


def consumed_queues(queues: str | None, namespaces: list[str]) -> str:
    """The queues a worker consumes: ``--queues`` and those of each ``--namespace`` (the default
    queues when neither is given); a bad namespace exits with its error."""
    from shared.errors import InvalidRequest
    from shared.queues import DEFAULT_NAMESPACE, check_namespace, namespace_queues

    names = [q for q in (queues or "").split(",") if q]
    for raw in namespaces:
        try:
            namespace = check_namespace(raw) or DEFAULT_NAMESPACE
        except InvalidRequest as exc:
            raise SystemExit(f"wesichain worker: {exc.message}") from None
        names += namespace_queues(namespace)
    if queues is None and not namespaces:
        names = list(DEFAULT_QUEUES)
    return ",".join(dict.fromkeys(names))


def default_node_name(queues: str, pid: int) -> str:
    """The node name of a worker started without ``--name``: what it consumes and its pid.

    Celery's own default, ``celery@HOST``, is the same for every worker of a host: two of them
    (one per queue, as deployments run) would share one record in the registry, each overwriting
    the other's, and the pool would look alternately without model and without tool consumers.
    The pid keeps two workers of the same queues on one host apart too.
    """
    kinds = [q.removeprefix(f"{DEFAULT_NAMESPACE}.") for q in queues.split(",") if q]
    return f"{'-'.join(kinds) or 'worker'}-{pid}@%h"


def worker(args: argparse.Namespace) -> int:
    import os

    from shared.settings import ENV_METRICS_PORT, Settings

    if args.metrics_port is not None:
        os.environ[ENV_METRICS_PORT] = str(args.metrics_port)
    if Settings.from_env().metrics_port:
        from worker.metrics import prepare_multiprocess

        # Before the app (and prometheus-client) is imported: the pool children fork from here.
        prepare_multiprocess()
    from worker.app import app, check_agents_module

    queues = consumed_queues(args.queues, args.namespace)
    check_agents_module(app)  # before consuming anything: a worker that cannot import them must not start
    argv = [f"--queues={queues}", f"--pool={args.pool}", f"--loglevel={args.loglevel}"]
    if args.concurrency:
        argv.append(f"--concurrency={args.concurrency}")
    celery_args = [a for a in args.celery_args if a != "--"]
    if args.name:
        argv.append(f"--hostname={args.name}")
    elif not any(a.startswith(("-n", "--hostname")) for a in celery_args):
        argv.append(f"--hostname={default_node_name(queues, os.getpid())}")
    argv.extend(celery_args)
    return run_celery_worker(app, argv)


def run_celery_worker(app: Any, argv: list[str]) -> int:
    """Celery's own ``worker`` command on ``app`` with ``argv`` (its options), and its exit code.

    Not ``app.worker_main``: that goes through the ``celery`` command group, which imports every
    installed ``celery.commands`` plugin (Flower with Tornado and prometheus-client, the shell's
    REPL with prompt_toolkit) into the worker, and so into every pool process forked from it:
    11-12 MiB in each process that nothing here uses. The command and its options are the same."""
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as command
    from click.exceptions import ClickException, Exit

    command.params.extend(app.user_options.get("worker", []))
    context = CLIContext(app=app, no_color=False, workdir=None)
    try:
        command.main(args=argv, prog_name="wesichain worker", obj=context, standalone_mode=False)
    except Exit as exc:
        return exc.exit_code
    except ClickException as exc:  # an option Celery's worker does not take, say
        print(f"wesichain worker: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    return 0


def sweeper(args: argparse.Namespace) -> int:
    from worker.app import app
    from worker.sweeper import Sweeper

    holder = app.wesichain_runtime
    sweeper = Sweeper(holder.get(), holder.probe(), holder.evals, holder.pipelines)
    with_schedules = args.schedules or holder.get().settings.sweeper_schedules
    if args.once:
        print(f"handed on {sweeper.sweep_once_and_release()} run(s)")
        if with_schedules:
            print(f"handled {_scheduler(holder.get().settings).pass_once()} tick(s)")
        return 0
    if with_schedules:
        _scheduler(holder.get().settings).start_thread()
    sweeper.run_forever()
    return 0


def _scheduler(settings: Settings) -> Scheduler:
    """The schedules' loop for the sweeper's process, on a client of its own."""
    from producer.client import Client
    from producer.scheduler import Scheduler

    return Scheduler(Client(settings))


def demo(args: argparse.Namespace) -> int:
    from producer.commands import print_event, print_head
    from shared.examples.research import DEMO_QUESTION
    from shared.state import Phase
    from worker.embedded import embedded

    if args.tour:
        return _tour(args)
    question = args.question or DEMO_QUESTION
    with embedded(args.agents, archive=True) as client:
        archive_url = client.settings.archive_url
        if not args.json:
            print(
                "Asking the research assistant (embedded: in-process broker, Redis stand-in and worker):\n"
                f"  {question}\n"
            )
        handle = client.submit(args.agent, question, model=args.model)
        for event in handle.events():
            if event.kind == "TokenDelta" and not args.json:
                continue  # shown as the final answer below; --json prints every delta
            print_event(event, args.json)
        head = handle.wait(timeout=60)
        if not args.json:
            print()
        print_head(head, args.json)
    if not args.json:  # archived as the embedded pool ended
        print(
            f"\nThe run is kept in {archive_url}; read it again with\n  WESICHAIN_REDIS_URL=memory://"
            f" WESICHAIN_ARCHIVE_URL={archive_url} wesichain export {head.run_id}",
            file=sys.stderr,
        )
    return 0 if head.phase is Phase.COMPLETED else 1


def _tour(args: argparse.Namespace) -> int:
    """``demo --tour``: the research example's tour (``worker/demo_tour.py``), embedded."""
    from worker.demo_tour import run_tour
    from worker.embedded import embedded

    if args.question or args.json or args.model or args.agent != "research" or args.agents:
        raise SystemExit(
            "wesichain demo --tour: the tour asks its own questions of its own agents;"
            " give it no question, --agent, --agents, --model or --json"
        )
    with embedded("shared.examples.research") as client:
        return run_tour(client)


def metrics(args: argparse.Namespace) -> int:
    import threading

    from shared.redis_client import connect
    from shared.settings import Settings
    from shared.store import RunStore
    from worker.exporter import serve_pool

    settings = Settings.from_env()
    store = RunStore(connect(settings), settings)
    serve_pool(store, settings, args.port, args.address)
    print(f"serving the pool's metrics on http://{args.address}:{args.port}/metrics", flush=True)
    threading.Event().wait()  # until the process is stopped
    return 0


def gc(args: argparse.Namespace) -> int:
    from shared.redis_client import connect
    from shared.retention import GarbageCollector
    from shared.settings import Settings

    settings = Settings.from_env()
    report = GarbageCollector(connect(settings), settings).collect(dry_run=args.dry_run)
    if args.json:
        print(report.to_json())
        return 0
    verb = "would remove" if report.dry_run else "removed"
    print(f"scanned {report.keys_scanned} run keys in {report.seconds:.1f}s")
    print(f"{verb}: {report.index_entries_of_gone_runs} index entries of runs that are gone,")
    print(f"  {report.index_entries_past_retention} index entries older than the retention,")
    print(f"  {report.orphan_keys} orphaned run keys, {report.expired_runs} ended runs past their retention")
    print(
        f"  ({report.bytes_freed / 2**20:.2f} MiB); {report.runs_given_ttl} ended runs given their retention"
    )
    print(f"kept: {report.live_runs} live runs, {report.runs_expiring} ended runs expiring on time")
    if report.runs_awaiting_archive or report.runs_handed_to_archiver:
        print(
            f"for the archive: {report.runs_handed_to_archiver} ended runs handed to the archiver,"
            f" {report.runs_awaiting_archive} past the retention waiting for it"
        )
    used, maximum = report.memory.get("used_bytes", 0), report.memory.get("maxmemory_bytes", 0)
    limit = f"of {maximum / 2**20:.1f} MiB" if maximum else "(no maxmemory set)"
    print(f"Redis uses {used / 2**20:.1f} MiB {limit}")
    return 0


def archive(args: argparse.Namespace) -> int:
    from shared.archiver import Archiver
    from shared.redis_client import connect
    from shared.settings import Settings
    from shared.store import RunStore

    settings = Settings.from_env()
    store = RunStore(connect(settings), settings)
    try:
        return _archive_passes(Archiver(store), args, settings.archive_interval_s)
    finally:
        store.close_archive()


def _archive_passes(archiver: Any, args: argparse.Namespace, interval_s: float) -> int:
    import time

    while True:
        report = archiver.run_once(after_s=args.after, max_runs=args.max)
        if args.json:
            print(report.to_json(), flush=True)
        else:
            print(
                f"archived {report.archived} run(s) in {report.seconds:.1f}s"
                f" ({report.already_archived} already in the archive, {report.deferred} deferred,"
                f" {report.gone} expired before archiving, {report.mismatched} kept after a mismatch)",
                flush=True,
            )
            if report.error:
                print(f"wesichain: archiving stopped: {report.error}", file=sys.stderr, flush=True)
        if not args.loop:
            return 1 if report.error or report.mismatched else 0
        time.sleep(interval_s)


def prune(args: argparse.Namespace) -> int:
    from shared.archive.retention import ArchivePruner
    from shared.errors import ArchiveUnavailable
    from shared.redis_client import connect
    from shared.settings import Settings
    from shared.store import RunStore
    from shared.tenants import Tenants

    settings = Settings.from_env()
    store = RunStore(connect(settings), settings)
    if store.archive is None:
        raise ArchiveUnavailable("no archive is configured (WESICHAIN_ARCHIVE_URL)")
    pruner = ArchivePruner(store.archive, Tenants(store.redis, store.keys), settings.archive_retention_days)
    try:
        report = pruner.prune(dry_run=args.dry_run)
    finally:
        store.close_archive()
    if args.json:
        print(report.to_json())
        return 0
    verb = "would delete" if report.dry_run else "deleted"
    tenants = ", ".join(f"{tenant}: {n}" for tenant, n in sorted(report.by_tenant.items()))
    print(f"{verb} {report.deleted} archived run(s) past their retention{f' ({tenants})' if tenants else ''}")
    return 0


def archive_retention(args: argparse.Namespace) -> int:
    from shared.redis_client import connect
    from shared.settings import Settings
    from shared.store import RunStore
    from shared.tenants import Tenants

    settings = Settings.from_env()
    store = RunStore(connect(settings), settings)
    tenants = Tenants(store.redis, store.keys)
    if args.tenant is None:
        default = settings.archive_retention_days
        print(f"every tenant: {f'{default:g} days' if default else 'forever'}")
        for tenant, days in sorted(tenants.archive_retention().items()):
            print(f"{tenant}: {f'{days:g} days' if days else 'forever'}")
        return 0
    if args.days is None and not args.default:
        raise ValueError("give --days N (0: forever) or --default")
    tenants.set_archive_retention(args.tenant, None if args.default else args.days)
    print(f"tenant {args.tenant}: " + ("every tenant's retention" if args.default else f"{args.days:g} days"))
    return 0
