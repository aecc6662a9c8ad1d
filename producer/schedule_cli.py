"""``wesichain schedules`` and ``wesichain scheduler``: manage schedules, and fire their ticks.

Both use the run state's Redis as an operator does; ``--tenant`` names whose schedules (none:
schedules without a tenant). Tenants use the HTTP API (``/v1/schedules``) with their keys instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from producer.client import Client
from shared.errors import InvalidRequest
from shared.schedules import MAX_CATCH_UP, Schedule

__all__ = ["Handler", "register", "run_scheduler", "schedules_command"]

Handler = Callable[[argparse.Namespace], int]


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    sc = sub.add_parser("schedules", parents=[common], help="cron and interval schedules that start runs")
    verbs = sc.add_subparsers(dest="schedules_command", required=True)
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", help="whose schedules (default: schedules without a tenant)")
    tenant.add_argument("--json", action="store_true", help="print JSON")
    c = verbs.add_parser("create", parents=[common, tenant], help="a new schedule of an agent's runs")
    c.add_argument("agent")
    c.add_argument("input", help="the input of every run it starts")
    when = c.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="a cron expression (5 fields, or 6 with seconds last)")
    when.add_argument("--every", type=int, metavar="SECONDS", help="a fixed interval")
    c.add_argument("--tz", default="UTC", help="the cron expression's time zone (default UTC)")
    c.add_argument(
        "--anchor", type=int, metavar="UNIX_S", help="an interval's first tick (default: now + interval)"
    )
    c.add_argument("--meta", metavar="JSON", help="the runs' metadata, a JSON object")
    c.add_argument("--thread", help="the runs' conversation thread")
    c.add_argument("--assistant", help="run as this assistant of the tenant")
    c.add_argument("--missed", choices=("skip", "catch_up"), default="skip", help="ticks missed in an outage")
    c.add_argument(
        "--catch-up", type=int, default=1, help=f"with --missed catch_up: at most N (1..{MAX_CATCH_UP})"
    )
    c.add_argument(
        "--overlap",
        choices=("skip", "enqueue", "allow"),
        default="skip",
        help="while the previous run goes on: no run, wait in the thread, or side by side",
    )
    c.add_argument("--no-check-agent", action="store_true", help="accept an agent no live worker serves now")
    verbs.add_parser("ls", parents=[common, tenant], help="the tenant's schedules")
    for verb, text in (
        ("show", "a schedule, its next fire times and last runs"),
        ("pause", "stop firing"),
        ("resume", "fire again from the next tick"),
        ("rm", "delete a schedule (its runs go on)"),
    ):
        v = verbs.add_parser(verb, parents=[common, tenant], help=text)
        v.add_argument("schedule_id")
    s = sub.add_parser("scheduler", parents=[common], help="fire the schedules' due ticks (run one or more)")
    s.add_argument("--interval", type=float, default=0.25, help="seconds between looks at the due set")
    s.add_argument("--once", action="store_true", help="fire what is due now, then exit")
    return {"schedules": schedules_command, "scheduler": run_scheduler}


def _show(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        print(schedule.model_dump_json())
        return
    timing = schedule.timing
    when = f"cron {timing.cron!r} {timing.timezone}" if timing.cron else f"every {timing.every_s}s"
    state = "paused" if schedule.paused else f"next {_stamp(schedule.next_fire)}"
    print(
        f"{schedule.schedule_id}  {schedule.agent}  {when}  {state}  started {schedule.started},"
        f" skipped {schedule.skipped}, missed {schedule.missed_ticks}, failed {schedule.failed}"
    )


def _stamp(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def schedules_command(args: argparse.Namespace) -> int:
    client = Client.from_env()
    schedules = client.schedules
    command = args.schedules_command
    if command == "create":
        metadata: Any = None
        if args.meta:
            try:
                metadata = json.loads(args.meta)
            except ValueError:
                raise InvalidRequest("--meta takes a JSON object") from None
        timing: dict[str, Any] = (
            {"cron": args.cron, "timezone": args.tz}
            if args.cron is not None
            else {"every_s": args.every, **({"anchor": args.anchor} if args.anchor is not None else {})}
        )
        created = schedules.create(
            args.agent,
            args.input,
            timing,
            tenant=args.tenant,
            metadata=metadata,
            thread_id=args.thread,
            assistant=args.assistant,
            missed=args.missed,
            catch_up=args.catch_up,
            overlap=args.overlap,
            check_agent=not args.no_check_agent,
        )
        _show(created, args.json)
        return 0
    if command == "ls":
        for schedule in schedules.list(tenant=args.tenant):
            _show(schedule, args.json)
        return 0
    if command == "pause":
        _show(schedules.pause(args.schedule_id, tenant=args.tenant), args.json)
        return 0
    if command == "resume":
        _show(schedules.resume(args.schedule_id, tenant=args.tenant), args.json)
        return 0
    if command == "rm":
        schedules.delete(args.schedule_id, tenant=args.tenant)
        print(f"deleted {args.schedule_id}")
        return 0
    schedule = schedules.get(args.schedule_id, tenant=args.tenant)
    fire_times = schedules.next_fire_times(args.schedule_id, 5, tenant=args.tenant)
    runs = schedules.runs(args.schedule_id, 10, tenant=args.tenant)
    if args.json:
        print(
            json.dumps(
                {
                    "schedule": schedule.model_dump(mode="json"),
                    "next_fire_times": fire_times,
                    "runs": [r.model_dump(mode="json") for r in runs],
                }
            )
        )
        return 0
    _show(schedule, False)
    for at in fire_times:
        print(f"  next  {_stamp(at)}")
    for tick in runs:
        detail = tick.run_id or tick.reason or (f"{tick.missed} ticks" if tick.missed else "")
        print(f"  {_stamp(tick.tick)}  {tick.outcome:<8} {detail}  {tick.status or ''}".rstrip())
    return 0


def run_scheduler(args: argparse.Namespace) -> int:
    from producer.scheduler import Scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scheduler = Scheduler(Client.from_env(), interval_s=max(0.05, args.interval))
    if args.once:
        print(f"handled {scheduler.pass_once()} tick(s)")
        return 0
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: scheduler.stop())
    scheduler.run()
    return 0
