"""``wesichain schedules`` and ``wesichain scheduler``: manage schedules, and fire their ticks.

``wesichain schedules`` uses the run state's Redis as an operator does (``--tenant`` names whose
schedules; none: schedules without a tenant), or with ``--api`` (or ``$WESICHAIN_API_URL``) the
HTTP API with a key, as a tenant does (the key's tenant's schedules). ``wesichain scheduler`` needs
Redis and the broker.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Any, cast

from producer.client import Client
from producer.commands import over_api
from shared.errors import InvalidRequest
from shared.schedules import MAX_CATCH_UP, Schedule, ScheduleTick

__all__ = ["Handler", "register", "run_scheduler", "schedules_command"]

Handler = Callable[[argparse.Namespace], int]


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    sc = sub.add_parser("schedules", parents=[common], help="cron and interval schedules that start runs")
    verbs = sc.add_subparsers(dest="schedules_command", required=True)
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument(
        "--tenant", help="without --api: whose schedules (default: schedules without a tenant)"
    )
    tenant.add_argument("--json", action="store_true", help="print JSON")
    tenant.add_argument("--api", metavar="URL", help="use the HTTP API at URL (default $WESICHAIN_API_URL)")
    tenant.add_argument("--key", metavar="KEY", help="the API key (default $WESICHAIN_API_KEY)")
    c = verbs.add_parser(
        "create", parents=[common, tenant], help="a new schedule of an agent's runs (or pipeline runs)"
    )
    c.add_argument("agent", help="the agent of its runs (with --pipeline: the pipeline)")
    c.add_argument("input", help="the input of every run it starts")
    c.add_argument("--pipeline", action="store_true", help="AGENT names a pipeline: start pipeline runs")
    c.add_argument("--until", type=int, metavar="UNIX_S", help="an end date: no tick after it fires")
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
    u = verbs.add_parser("update", parents=[common, tenant], help="change a schedule (what is given)")
    u.add_argument("schedule_id")
    u_when = u.add_mutually_exclusive_group()
    u_when.add_argument("--cron", help="a new cron expression (the next tick is recomputed from now)")
    u_when.add_argument("--every", type=int, metavar="SECONDS", help="a new fixed interval")
    u.add_argument("--tz", default="UTC", help="with --cron: its time zone (default UTC)")
    u.add_argument("--anchor", type=int, metavar="UNIX_S", help="with --every: its first tick")
    u.add_argument("--input", help="a new input of its runs")
    u.add_argument("--meta", metavar="JSON", help="new metadata of its runs, a JSON object")
    u.add_argument("--missed", choices=("skip", "catch_up"), help="ticks missed in an outage")
    u.add_argument("--catch-up", type=int, help=f"with --missed catch_up: at most N (1..{MAX_CATCH_UP})")
    u.add_argument("--overlap", choices=("skip", "enqueue", "allow"), help="while the previous run goes on")
    u_end = u.add_mutually_exclusive_group()
    u_end.add_argument("--until", type=int, metavar="UNIX_S", help="a new end date")
    u_end.add_argument("--no-until", action="store_true", help="remove the end date")
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
    state = (
        "paused" if schedule.paused else "ended" if schedule.ended else f"next {_stamp(schedule.next_fire)}"
    )
    until = f" until {_stamp(schedule.until)}" if schedule.until is not None else ""
    what = schedule.agent if schedule.pipeline is None else f"pipeline {schedule.pipeline}"
    print(
        f"{schedule.schedule_id}  {what}  {when}{until}  {state}  started {schedule.started},"
        f" skipped {schedule.skipped}, missed {schedule.missed_ticks}, failed {schedule.failed}"
    )


def _stamp(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


class _Over:
    """The schedules' calls, on Redis (as ``--tenant``) or over the HTTP API (as the key's tenant):
    the two have the same methods, the Redis one with ``tenant``."""

    def __init__(self, args: argparse.Namespace) -> None:
        api = over_api(args)
        if api is not None and args.tenant:
            raise InvalidRequest("--tenant is for Redis: over the API the key's tenant is the one")
        self.target: Any = api.schedules if api is not None else Client.from_env().schedules
        self.tenant: dict[str, Any] = {} if api is not None else {"tenant": args.tenant}

    def __call__(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.target, verb)(*args, **kwargs, **self.tenant)


def _meta(raw: str | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidRequest("--meta takes a JSON object") from None


def _timing_of(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.cron is not None:
        return {"cron": args.cron, "timezone": args.tz}
    if args.every is None:
        return None
    return {"every_s": args.every, **({"anchor": args.anchor} if args.anchor is not None else {})}


def schedules_command(args: argparse.Namespace) -> int:
    call = _Over(args)
    command = args.schedules_command
    if command == "create":
        created = call(
            "create",
            None if args.pipeline else args.agent,
            args.input,
            _timing_of(args),
            metadata=_meta(args.meta),
            thread_id=args.thread,
            assistant=args.assistant,
            missed=args.missed,
            catch_up=args.catch_up,
            overlap=args.overlap,
            check_agent=not args.no_check_agent,
            pipeline=args.agent if args.pipeline else None,
            until=args.until,
        )
        _show(created, args.json)
        return 0
    if command == "update":
        updated = call(
            "update",
            args.schedule_id,
            timing=_timing_of(args),
            input=args.input,
            metadata=_meta(args.meta),
            missed=args.missed,
            catch_up=args.catch_up,
            overlap=args.overlap,
            until=args.until,
            clear_until=args.no_until,
        )
        _show(updated, args.json)
        return 0
    if command == "ls":
        for listed in call("list"):
            _show(listed, args.json)
        return 0
    if command in ("pause", "resume"):
        _show(call(command, args.schedule_id), args.json)
        return 0
    if command == "rm":
        call("delete", args.schedule_id)
        print(f"deleted {args.schedule_id}")
        return 0
    schedule: Schedule = call("get", args.schedule_id)
    fire_times = cast(list[int], call("next_fire_times", args.schedule_id, 5))
    runs = cast(list[ScheduleTick], call("runs", args.schedule_id, 10))
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
        started = tick.run_id or (f"pipeline {tick.pipeline_id}" if tick.pipeline_id else None)
        detail = started or tick.reason or (f"{tick.missed} ticks" if tick.missed else "")
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
