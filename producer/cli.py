"""wesichain: submit and follow runs, list what the workers serve, run workers, try it all with demo.

The producer's commands are defined here; the worker's (worker, sweeper, demo) come from the
installed package through the ``wesichain.commands`` entry point group, so this module never
imports worker code.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from shared.errors import ConfigError, InvalidRequest, ThreadBusy, WesichainError
from shared.settings import ENV_AGENTS, ENV_BROKER_URL, ENV_REDIS_URL, Settings, redact_url
from shared.state import THREAD_POLICIES
from shared.tls import RedisTlsError

__all__ = [
    "DESCRIPTION",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED_RUN",
    "EXIT_THREAD_BUSY",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "Handler",
    "Register",
    "assistants_command",
    "main",
]

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
#: A submit with thread policy ``reject`` found its thread busy (the message names the busy run).
EXIT_THREAD_BUSY = 4

Handler = Callable[[argparse.Namespace], int]
#: What a command group adds: its subcommands, and the handler of each.
Register = Callable[
    ["argparse._SubParsersAction[argparse.ArgumentParser]", argparse.ArgumentParser], dict[str, Handler]
]

DESCRIPTION = (
    "Run LLM agents as durable, distributed state machines on Celery and Redis: submit and follow"
    " runs, list what the workers serve, run workers, or try it all in one process with 'demo'."
)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis", metavar="URL", help=f"Redis URL (default ${ENV_REDIS_URL} or redis://127.0.0.1:6379/0)"
    )
    common.add_argument("--agents", metavar="MODULE", help=f"agents module to import (default ${ENV_AGENTS})")
    common.add_argument(
        "--broker",
        metavar="URL",
        help=f"the broker: RabbitMQ (amqp://...) or a standalone Redis (redis://...); default"
        f" ${ENV_BROKER_URL} or the Redis of --redis",
    )
    return common


def _producer_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    from producer import commands

    # The run commands go through the HTTP API with a key when given one, else straight to Redis.
    api = argparse.ArgumentParser(add_help=False)
    api.add_argument("--api", metavar="URL", help="use the HTTP API at URL (default $WESICHAIN_API_URL)")
    api.add_argument("--key", metavar="KEY", help="the API key (default $WESICHAIN_API_KEY)")
    runs = [common, api]

    s = sub.add_parser("submit", parents=runs, help="submit a run")
    s.add_argument("agent")
    s.add_argument("text")
    s.add_argument("--wait", action="store_true", help="follow the run and wait for its end")
    s.add_argument(
        "--timeout", type=float, default=300.0, help="with --wait: give up after this many seconds"
    )
    s.add_argument("--json", action="store_true", help="print the run id (or events and the end) as JSON")
    s.add_argument("--model", help="override the agent's model (PROVIDER:MODEL)")
    s.add_argument("--thread", help="conversation thread id (carries history across runs)")
    s.add_argument(
        "--thread-policy",
        choices=THREAD_POLICIES,
        help="while another run of the thread has not ended: reject (exit 4, naming it), enqueue (wait"
        " its turn), interrupt (stop it, keep its messages), rollback (cancel it, drop its messages);"
        " default: the agent's",
    )
    s.add_argument(
        "--no-check", action="store_true", help="submit even if no live worker serves the agent (queue it)"
    )
    s.add_argument(
        "--namespace",
        metavar="NAME",
        help="send the run's tasks to the queues NAME.model, NAME.tools, NAME.callbacks (over the API:"
        " a namespace the key's tenant is allowed)",
    )

    s.add_argument(
        "--assistant",
        metavar="NAME[@VERSION]",
        help="run the agent as this assistant configures it (its current version, or VERSION)",
    )
    s.add_argument("--tenant", help="the run's tenant (straight to Redis; over the API the key's)")
    _assistant_commands(sub, common)

    st = sub.add_parser("status", parents=runs, help="show a run's state")
    st.add_argument("run_id")
    st.add_argument("--json", action="store_true", help="print the run's state as JSON")

    e = sub.add_parser("events", parents=runs, help="print a run's events")
    e.add_argument("run_id")
    e.add_argument("--follow", "-f", action="store_true", help="keep following until the run ends")
    e.add_argument("--after", metavar="ID", default="0-0", help="only events after this stream id (resume)")
    e.add_argument("--json", action="store_true", help="one JSON object per event")

    x = sub.add_parser(
        "export", parents=[common], help="write a run whole (Redis or the archive) as one JSON document"
    )
    x.add_argument("run_id")
    x.add_argument("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
    x.add_argument("--indent", action="store_true", help="indent the JSON for reading")

    c = sub.add_parser("cancel", parents=runs, help="cancel a run")
    c.add_argument("run_id")

    cp = sub.add_parser("checkpoints", parents=[common], help="list a run's committed heads (to fork from)")
    cp.add_argument("run_id")
    cp.add_argument("--json", action="store_true", help="print them as JSON")
    fk = sub.add_parser("fork", parents=[common], help="start a new run from a checkpoint of another")
    fk.add_argument("run_id")
    fk.add_argument("version", type=int, help="the checkpoint's version (wesichain checkpoints RUN_ID)")
    fk.add_argument("--input", help="replace the last user message with this text")
    fk.add_argument("--model", help="another PROVIDER:MODEL (default: the original's)")
    fk.add_argument("--wait", action="store_true", help="follow the new run and wait for its end")
    fk.add_argument(
        "--timeout", type=float, default=300.0, help="with --wait: give up after this many seconds"
    )
    fk.add_argument("--json", action="store_true", help="print the run id (or events and the end) as JSON")

    rt = sub.add_parser("retry", parents=runs, help="start a fresh run with an ended run's request")
    rt.add_argument("run_id")
    rt.add_argument("--wait", action="store_true", help="follow the new run and wait for its end")
    rt.add_argument(
        "--timeout", type=float, default=300.0, help="with --wait: give up after this many seconds"
    )
    rt.add_argument("--json", action="store_true", help="print the run id (or events and the end) as JSON")
    ch = sub.add_parser("children", parents=runs, help="list a run's subagent runs")
    ch.add_argument("run_id")
    ch.add_argument("--json", action="store_true", help="print them as a JSON list")

    for verb, text in (
        ("approve", "approve what a parked run waits on"),
        ("deny", "deny it (the model is told)"),
    ):
        a = sub.add_parser(verb, parents=runs, help=text)
        a.add_argument("run_id")
        a.add_argument("--note", default="", help="a note the model (and the run's history) will see")
        a.add_argument(
            "--by",
            metavar="WHO",
            help="who decides, kept in the run's events (default: the OS user; over --api: the key)",
        )
        if verb == "approve":
            a.add_argument(
                "--always", action="store_true", help="the same tools need no approval again in this run"
            )

    sd = sub.add_parser("send", parents=runs, help="send a user message into a running run")
    sd.add_argument("run_id")
    sd.add_argument("text", help="the message; the run's next think sees it")
    sd.add_argument(
        "--idempotency-key", metavar="KEY", help="a client key: sending again under it sends nothing new"
    )
    sd.add_argument("--json", action="store_true", help="print the signal as JSON")
    sd.add_argument("--by", metavar="WHO", help="who sends it, in the run's events (default: the OS user)")
    up = sub.add_parser(
        "update", parents=runs, help="send a state update into a running run and wait for its outcome"
    )
    up.add_argument("run_id")
    up.add_argument("patch", metavar="JSON", help="state fields to merge, e.g. '{\"priority\": 3}'")
    up.add_argument(
        "--idempotency-key", metavar="KEY", help="a client key: sending again under it sends nothing new"
    )
    up.add_argument(
        "--wait", type=float, default=30.0, help="seconds to wait for the outcome (default 30; 0: do not)"
    )
    up.add_argument("--json", action="store_true", help="print the signal as JSON")
    up.add_argument("--by", metavar="WHO", help="who sends it, in the run's events (default: the OS user)")

    tl = sub.add_parser(
        "timeline", parents=runs, help="show where a run's time went, per worker (phases, tools, waits)"
    )
    tl.add_argument("run_id")
    tl.add_argument("--json", action="store_true", help="the timeline as JSON")
    tl.add_argument("--width", type=int, default=72, help="columns of the picture (default 72)")

    ag = sub.add_parser("agents", parents=runs, help="list the agents live workers serve")
    ag.add_argument("--json", action="store_true", help="print them as JSON")
    wk = sub.add_parser(
        "workers",
        parents=[common],
        help="list live workers, the agent versions they serve and the runs each version holds",
    )
    wk.add_argument("--json", action="store_true", help="print them as JSON")
    wks = wk.add_subparsers(dest="workers_command")
    vs = wks.add_parser(
        "versions",
        parents=runs,
        help="each live agent version: its workers and the runs pinned to it (over the API: the"
        " key's tenant's runs only)",
    )
    vs.add_argument("--json", action="store_true", help="print them as JSON")
    pl = wks.add_parser(
        "pool",
        parents=runs,
        help="the operator view: live workers, queue depths, leases, parked runs, runs ended per"
        " minute (over the API: what the key may see)",
    )
    pl.add_argument("--json", action="store_true", help="print it as JSON")
    pl.add_argument("--minutes", type=int, default=60, help="minutes of runs ended (default 60)")
    dr = wks.add_parser(
        "drain",
        parents=[common],
        help="stop a worker (or every worker of an agent version) taking new runs; it exits once"
        " no queued or running run of its versions is left",
    )
    dr.add_argument("worker", nargs="?", help="the worker's node name (as `wesichain workers` lists it)")
    dr.add_argument(
        "--version", dest="agent_version", metavar="AGENT:N", help="every worker of this agent version"
    )
    dr.add_argument("--cancel", action="store_true", help="take the request back (a draining worker goes on)")
    h = sub.add_parser(
        "health", parents=[common], help="exit 0 if this host's workers are live and consuming (a probe)"
    )
    h.add_argument("--worker", help="the worker's node name (default: every worker of this host)")
    return {
        "submit": commands.submit,
        "status": commands.status,
        "events": commands.events,
        "export": commands.export,
        "cancel": commands.cancel,
        "checkpoints": commands.checkpoints,
        "fork": commands.fork,
        "retry": commands.retry,
        "children": commands.children,
        "approve": commands.approve,
        "deny": commands.deny,
        "send": commands.send,
        "update": commands.update,
        "timeline": commands.timeline,
        "agents": commands.agents,
        "workers": commands.workers,
        "health": commands.health,
        "assistants": assistants_command,
    }


def _assistant_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    a = sub.add_parser(
        "assistants", parents=[common], help="create, change, show, compare, roll back and delete assistants"
    )
    a.add_argument("--tenant", help="without --api: whose assistants (default: the tenant-less runs')")
    a.add_argument("--api", metavar="URL", help="use the HTTP API at URL (default $WESICHAIN_API_URL)")
    a.add_argument("--key", metavar="KEY", help="the API key (default $WESICHAIN_API_KEY)")
    a.add_argument("--json", action="store_true", help="print JSON")
    acts = a.add_subparsers(dest="assistants_command", required=True)
    c = acts.add_parser("create", help="a new assistant: its version 1")
    c.add_argument("name")
    c.add_argument("--agent", required=True, help="the agent it configures")
    c.add_argument("--config", default="{}", help="the configuration as JSON, or @FILE")
    u = acts.add_parser("update", help="a new version with this configuration (as a whole)")
    u.add_argument("name")
    u.add_argument("--config", required=True, help="the configuration as JSON, or @FILE")
    u.add_argument("--if-version", type=int, help="only while this is the current version")
    sh = acts.add_parser("show", help="its current version, or --version N")
    sh.add_argument("name")
    sh.add_argument("--version", type=int, help="this version instead of the current one")
    sh.add_argument("--versions", action="store_true", help="every version, newest first")
    acts.add_parser("ls", help="the tenant's assistants")
    d = acts.add_parser("diff", help="what changed from one version to another")
    d.add_argument("name")
    d.add_argument("before", type=int)
    d.add_argument("after", type=int)
    r = acts.add_parser("rollback", help="a new version equal to VERSION")
    r.add_argument("name")
    r.add_argument("version", type=int)
    rm = acts.add_parser("delete", help="no new run names it; runs pinned to it go on with their version")
    rm.add_argument("name")


def assistants_command(args: argparse.Namespace) -> int:
    from producer.assistant_cli import run_assistants

    return run_assistants(args)


def _parser(command: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The parser and the handler of each command; for ``command`` (the first argument), when an
    installed group provides it, only the installed groups' commands."""
    p = argparse.ArgumentParser(prog="wesichain", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"wesichain {_version()}")
    common = _common()
    sub = p.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}
    for entry in sorted(entry_points(group="wesichain.commands"), key=lambda e: e.name):
        register: Register = entry.load()
        handlers.update(register(sub, common))
    if command in handlers:
        # The producer's commands load the client, the evals' report and live view and the
        # terminal renderer: a worker (or API) process that never runs them must not pay for them
        # in its memory, in every pool process.
        return p, handlers
    handlers.update(_producer_commands(sub, common))
    from producer.evals.cli import register as register_evals

    handlers.update(register_evals(sub, common))
    from producer.pipeline_cli import register as register_pipelines

    handlers.update(register_pipelines(sub, common))
    from producer.memory_cli import register as register_memory

    handlers.update(register_memory(sub, common))

    from producer.search_cli import register as register_search

    handlers.update(register_search(sub, common))

    from producer.schedule_cli import register as register_schedules

    handlers.update(register_schedules(sub, common))
    return p, handlers


def _version() -> str:
    """The installed distribution's version (what ``pip`` installed, not a copy kept in the code)."""
    try:
        return version("wesichain")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


def _apply_env(args: argparse.Namespace) -> None:
    # Environment variables, not arguments, carry settings into prefork children and into the
    # module-level worker app, so every process of a worker resolves the same settings.
    if getattr(args, "redis", None):
        os.environ[ENV_REDIS_URL] = args.redis
    if getattr(args, "agents", None):
        os.environ[ENV_AGENTS] = args.agents
    if getattr(args, "broker", None):
        os.environ[ENV_BROKER_URL] = args.broker


def _parsed(argv: list[str]) -> tuple[argparse.Namespace, Handler]:
    """The arguments and their command's handler. The parser tree is not returned: a worker or API
    runs for days inside its handler, and the tree (about 0.1 MiB of small objects) would stay
    alive in its frame."""
    parser, handlers = _parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    return args, handlers[args.command]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, handler = _parsed(argv)
    _apply_env(args)
    import redis

    try:
        status = handler(args)
        # Flushed here, not at exit, so a reader that went away is seen by the handler below.
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _reader_gone()
    except ConfigError as exc:
        print(f"wesichain: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidRequest as exc:
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ThreadBusy as exc:  # names the busy run; submitting again once it ended is accepted
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_THREAD_BUSY
    except RedisTlsError as exc:  # it names the URL and what failed
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LookupError as exc:  # RunNotFound
        print(f"wesichain: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except WesichainError as exc:
        print(f"wesichain: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.ConnectionError as exc:
        print(f"wesichain: cannot reach Redis at {_redis_url()}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:
        # E.g. something that is not Redis listens on that port.
        print(f"wesichain: Redis at {_redis_url()} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


#: What a shell reports for a command killed by SIGPIPE (128 + 13), as ``yes | head`` does.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def _reader_gone() -> int:
    """Whoever read stdout closed it (``wesichain events ID | head``): stop quietly.

    Python ignores SIGPIPE, so the write raised instead; stdout now points at /dev/null, or the
    interpreter's own flush at exit would fail again and print about it.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _redis_url() -> str:
    """The Redis URL the command used, safe to print."""
    return redact_url(Settings.from_env().redis_url)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
