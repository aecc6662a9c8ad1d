"""The CLI's commands, one function each."""

from __future__ import annotations

import argparse
import json
import sys

from producer.client import Client, RunTimeout
from producer.render import render_event, render_head
from shared.events import Event
from shared.state import Phase, RunHead

EXIT_FAILED_RUN = 1
EXIT_TIMEOUT = 3


def _print_event(event: Event, as_json: bool) -> None:
    print(event.model_dump_json() if as_json else render_event(event), flush=True)


def _finish(head: RunHead, as_json: bool) -> int:
    print(head.model_dump_json() if as_json else render_head(head), flush=True)
    return 0 if head.phase is Phase.COMPLETED else EXIT_FAILED_RUN


def worker(args: argparse.Namespace) -> int:
    from worker.app import app

    argv = ["worker", f"--queues={args.queues}", f"--pool={args.pool}", f"--loglevel={args.loglevel}"]
    if args.concurrency:
        argv.append(f"--concurrency={args.concurrency}")
    if args.name:
        argv.append(f"--hostname={args.name}")
    argv.extend(a for a in args.celery_args if a != "--")
    app.worker_main(argv)
    return 0


def sweeper(args: argparse.Namespace) -> int:
    from worker.app import app
    from worker.sweeper import Sweeper

    holder = app.wesichain_runtime
    sweeper = Sweeper(holder.get(), holder.probe())
    if args.once:
        print(f"recovered {sweeper.tick()} run(s)")
        return 0
    sweeper.run_forever()
    return 0


def demo(args: argparse.Namespace) -> int:
    from producer.embedded import embedded
    from shared.examples.research import DEMO_QUESTION

    question = args.question or DEMO_QUESTION
    with embedded(args.agents) as client:
        if not args.json:
            print(
                "Asking the research assistant (embedded: in-process broker, Redis stand-in and worker):\n"
                f"  {question}\n"
            )
        handle = client.submit("research", question, model=args.model)
        for event in handle.events():
            if event.kind == "TokenDelta" and not args.json:
                continue  # shown as the final answer below; --json prints every delta
            _print_event(event, args.json)
        head = handle.wait(timeout=60)
        if not args.json:
            print()
        return _finish(head, args.json)


def submit(args: argparse.Namespace) -> int:
    client = Client.from_env()
    handle = client.submit(args.agent, args.text, model=args.model, thread_id=args.thread)
    if not args.wait:
        print(json.dumps({"run_id": handle.run_id}) if args.json else handle.run_id)
        return 0
    if not args.json:
        print(f"run {handle.run_id}", file=sys.stderr)
    try:
        for event in handle.events(idle_timeout=args.timeout):
            _print_event(event, args.json)
        head = handle.wait(timeout=args.timeout)
    except RunTimeout as exc:
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    return _finish(head, args.json)


def status(args: argparse.Namespace) -> int:
    head = Client.from_env().handle(args.run_id).status()
    print(head.model_dump_json() if args.json else render_head(head))
    return 0


def events(args: argparse.Namespace) -> int:
    handle = Client.from_env().handle(args.run_id)
    handle.status()  # raises RunNotFound for a bad id instead of waiting forever
    for event in handle.events(follow=args.follow):
        _print_event(event, args.json)
    return 0


def cancel(args: argparse.Namespace) -> int:
    phase = Client.from_env().handle(args.run_id).cancel()
    if phase is None:
        print(f"wesichain: no run {args.run_id!r}", file=sys.stderr)
        return EXIT_FAILED_RUN
    print(f"cancel requested (run was {phase.value})" if not phase.terminal else f"run already {phase.value}")
    return 0


def approve(args: argparse.Namespace) -> int:
    Client.from_env().handle(args.run_id).approve(args.note)
    print(f"approved; run {args.run_id} resumes")
    return 0


def deny(args: argparse.Namespace) -> int:
    Client.from_env().handle(args.run_id).deny(args.note)
    print(f"denied; run {args.run_id} resumes without the denied calls")
    return 0
