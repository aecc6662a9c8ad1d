"""``wesichain``: run workers, submit and follow runs, and try it all embedded with ``demo``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from shared.errors import ConfigError, WesichainError
from shared.settings import ENV_AGENTS, ENV_REDIS_URL, QUEUE_MODEL, QUEUE_TOOLS, redact_url

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wesichain", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis", metavar="URL", help=f"Redis URL (default ${ENV_REDIS_URL} or redis://127.0.0.1:6379/0)"
    )
    common.add_argument("--agents", metavar="MODULE", help=f"agents module to import (default ${ENV_AGENTS})")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo", parents=[common], help="run the research assistant embedded: no server, no API key"
    )
    d.add_argument("question", nargs="?", help="what to ask")
    d.add_argument("--json", action="store_true", help="print events and the final state as JSON lines")
    d.add_argument("--model", help="override the agent's model (PROVIDER:MODEL)")

    w = sub.add_parser("worker", parents=[common], help="run a Celery worker for the phase tasks")
    w.add_argument(
        "--queues", default=f"{QUEUE_MODEL},{QUEUE_TOOLS}", help="comma-separated queues to consume"
    )
    w.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    w.add_argument("--concurrency", "-c", type=int, default=None)
    w.add_argument("--name", "-n", default=None, help="worker node name, e.g. w1@%%h")
    w.add_argument("--loglevel", "-l", default="INFO")
    w.add_argument("celery_args", nargs=argparse.REMAINDER, help="after --, passed to `celery worker` as is")

    sw = sub.add_parser("sweeper", parents=[common], help="run the recovery sweeper standalone")
    sw.add_argument("--once", action="store_true", help="sweep once and exit")

    s = sub.add_parser("submit", parents=[common], help="submit a run")
    s.add_argument("agent")
    s.add_argument("text")
    s.add_argument("--wait", action="store_true", help="follow the run and wait for its end")
    s.add_argument("--timeout", type=float, default=300.0)
    s.add_argument("--json", action="store_true")
    s.add_argument("--model", help="override the agent's model (PROVIDER:MODEL)")
    s.add_argument("--thread", help="conversation thread id (carries history across runs)")

    st = sub.add_parser("status", parents=[common], help="show a run's state")
    st.add_argument("run_id")
    st.add_argument("--json", action="store_true")

    e = sub.add_parser("events", parents=[common], help="print a run's events")
    e.add_argument("run_id")
    e.add_argument("--follow", "-f", action="store_true", help="keep following until the run ends")
    e.add_argument("--json", action="store_true")

    c = sub.add_parser("cancel", parents=[common], help="cancel a run")
    c.add_argument("run_id")

    for verb, text in (
        ("approve", "approve what a parked run waits on"),
        ("deny", "deny it (the model is told)"),
    ):
        a = sub.add_parser(verb, parents=[common], help=text)
        a.add_argument("run_id")
        a.add_argument("--note", default="", help="a note the model (and the run's history) will see")
    return p


def _apply_env(args: argparse.Namespace) -> None:
    # Environment variables, not arguments, carry settings into prefork children and into the
    # module-level worker app, so every process of a worker resolves the same settings.
    if getattr(args, "redis", None):
        os.environ[ENV_REDIS_URL] = args.redis
    if getattr(args, "agents", None):
        os.environ[ENV_AGENTS] = args.agents


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _apply_env(args)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"wesichain: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WesichainError as exc:
        print(f"wesichain: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LookupError as exc:  # RunNotFound
        print(f"wesichain: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from producer import commands

    if args.command == "worker":
        return commands.worker(args)
    if args.command == "demo":
        return commands.demo(args)
    if args.command == "sweeper":
        return commands.sweeper(args)
    import redis

    try:
        return {
            "submit": commands.submit,
            "status": commands.status,
            "events": commands.events,
            "cancel": commands.cancel,
            "approve": commands.approve,
            "deny": commands.deny,
        }[args.command](args)
    except redis.ConnectionError as exc:
        url = redact_url(os.environ.get(ENV_REDIS_URL, "redis://127.0.0.1:6379/0"))
        print(f"wesichain: cannot reach Redis at {url}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def dump_json(obj: object) -> str:
    return json.dumps(obj, default=str)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
