"""``wesichain pipeline run|submit|status|cancel|events``.

``pipeline run`` submits a pipeline run and follows it to its end; with no Redis URL (``--redis`` or
``$WESICHAIN_REDIS_URL``), or with ``--embedded``, it runs in this process, as ``wesichain demo``
does. ``pipeline submit`` prints the new pipeline run's id at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from producer.client import Client
from producer.pipelines import PipelineHandle, PipelineTimeout
from producer.runtimes import run_embedded
from shared.errors import InvalidRequest
from shared.pipeline.status import PipelineStatus
from shared.settings import ENV_AGENTS, ENV_REDIS_URL

__all__ = ["EXIT_FAILED", "EXIT_TIMEOUT", "dispatch", "register", "render_status"]

#: The pipeline run failed or was cancelled.
EXIT_FAILED = 1
EXIT_TIMEOUT = 3


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Any]:
    p = sub.add_parser("pipeline", help="run pipelines of agent runs (then / map / reduce / branch)")
    verbs = p.add_subparsers(dest="pipeline_command", required=True)
    for verb, text in (
        ("run", "start a pipeline run and follow it to its end"),
        ("submit", "start a pipeline run and print its id"),
    ):
        r = verbs.add_parser(verb, parents=[common], help=text)
        r.add_argument("name", help="a pipeline the agents module registers")
        r.add_argument("input", help="the first step's input")
        r.add_argument("--id", dest="pipeline_id", help="the pipeline run's id (the same id: the same run)")
        r.add_argument("--no-check", action="store_true", help="do not look the pipeline up here first")
        r.add_argument(
            "--namespace",
            metavar="NAME",
            help="run its child runs and its own tasks on the queues NAME.model, NAME.tools, NAME.callbacks",
        )
        if verb == "run":
            r.add_argument(
                "--timeout", type=float, default=3600.0, help="give up waiting after this many seconds"
            )
            r.add_argument("--json", action="store_true", help="print events and the end as JSON lines")
            r.add_argument("--embedded", action="store_true", help="run in this process (no server)")
    st = verbs.add_parser("status", parents=[common], help="show a pipeline run, step by step")
    st.add_argument("pipeline_id")
    st.add_argument("--json", action="store_true", help="print the pipeline run as JSON")
    c = verbs.add_parser("cancel", parents=[common], help="cancel a pipeline run and its live child runs")
    c.add_argument("pipeline_id")
    ev = verbs.add_parser("events", parents=[common], help="print a pipeline run's events")
    ev.add_argument("pipeline_id")
    ev.add_argument("--follow", "-f", action="store_true", help="until it ends")
    return {"pipeline": dispatch}


def dispatch(args: argparse.Namespace) -> int:
    handler = {"run": _run, "submit": _submit, "status": _status, "cancel": _cancel, "events": _events}
    return handler[args.pipeline_command](args)


def _run(args: argparse.Namespace) -> int:
    embedded = args.embedded or not os.environ.get(ENV_REDIS_URL)
    if embedded and args.namespace:
        # The pool in this process consumes the default queues only: the run would never start.
        raise InvalidRequest("--namespace needs a Redis URL and workers serving it, not --embedded")
    context: AbstractContextManager[Client]
    if embedded:
        # One process: the in-memory broker, the Redis stand-in and a worker (as ``wesichain demo``).
        context = run_embedded(os.environ.get(ENV_AGENTS), concurrency=8, archive=True)
    else:
        context = nullcontext(Client.from_env())
    with context as client:
        handle = _start(client, args)
        print(
            f"pipeline run {handle.pipeline_id}" + (" (embedded: no server)" if embedded else ""),
            file=sys.stderr,
        )
        try:
            status = handle.wait(timeout=args.timeout)
        except PipelineTimeout as exc:
            print(f"wesichain: {exc}", file=sys.stderr)
            return EXIT_TIMEOUT
        print(status.model_dump_json(indent=2) if args.json else render_status(status))
        return 0 if status.status == "completed" else EXIT_FAILED


def _start(client: Client, args: argparse.Namespace) -> PipelineHandle:
    return client.submit_pipeline(
        args.name,
        args.input,
        pipeline_id=args.pipeline_id,
        check=not args.no_check,
        namespace=args.namespace,
    )


def _submit(args: argparse.Namespace) -> int:
    client = Client.from_env()
    print(_start(client, args).pipeline_id)
    return 0


def _status(args: argparse.Namespace) -> int:
    status = Client.from_env().pipeline(args.pipeline_id).status()
    print(status.model_dump_json(indent=2) if args.json else render_status(status))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    was = Client.from_env().pipeline(args.pipeline_id).cancel()
    print(f"pipeline run {args.pipeline_id} " + ("cancelled" if was == "ok" else f"already {was}"))
    return 0


def _events(args: argparse.Namespace) -> int:
    for event in Client.from_env().pipeline(args.pipeline_id).events(follow=args.follow):
        print(json.dumps(event, ensure_ascii=False))
    return 0


def render_status(status: PipelineStatus) -> str:
    """A pipeline run in a few lines: each step with its children's states, then the outcome."""
    lines = [f"pipeline run {status.pipeline_id} ({status.name}): {status.status}"]
    for step in status.steps:
        via = "".join(f" [{v['branch']} -> {v['case']}]" for v in step.via)
        counts = Counter(c.status for c in step.children)
        states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        lines.append(
            f"  {step.seq}. {step.name} ({step.kind} {step.agent}){via}: {step.done}/{step.total} ({states})"
        )
    if status.error is not None:
        lines.append(f"error: {status.error.get('kind')}: {status.error.get('message')}")
        if status.error.get("run_id"):
            lines.append(f"failing child run: {status.error['run_id']}")
    elif status.output is not None:
        out = status.output
        lines.append(
            "output: " + (out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, indent=2))
        )
    return "\n".join(lines)
