"""The producer's CLI commands, one function each."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import asdict

from producer.api_client import ENV_API_URL, ApiClient, ApiRunHandle
from producer.client import Client, RunHandle, RunNotFound
from producer.render import render_event, render_head
from shared.errors import InvalidRequest
from shared.events import END_EVENTS, Event
from shared.pool_records import MAX_SERIES_MINUTES
from shared.signals import SignalView
from shared.state import Phase, RunHead
from shared.versions import VersionLoad, waiting_for, waiting_reason
from shared.workers import AgentInfo

__all__ = [
    "EXIT_FAILED_RUN",
    "EXIT_TIMEOUT",
    "QUIET_S",
    "agents",
    "approve",
    "cancel",
    "checkpoints",
    "deny",
    "drain",
    "send",
    "update",
    "events",
    "export",
    "fork",
    "retry",
    "children",
    "health",
    "over_api",
    "print_event",
    "print_head",
    "status",
    "submit",
    "timeline",
    "workers",
    "UNWRAPPED_WIDTH",
]

EXIT_FAILED_RUN = 1
EXIT_TIMEOUT = 3
#: How long a submitted run may sit unclaimed before ``--wait`` says why.
QUIET_S = 10.0
#: The width a timeline is drawn at when it goes to a pipe or file: wide enough that nothing wraps.
UNWRAPPED_WIDTH = 10_000


def print_event(event: Event, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"stream_id": event.stream_id, **event.model_dump(mode="json")}), flush=True)
    else:
        print(render_event(event), flush=True)


def print_head(head: RunHead, as_json: bool) -> None:
    print(head.model_dump_json() if as_json else render_head(head), flush=True)


def _finish(head: RunHead, as_json: bool) -> int:
    print_head(head, as_json)
    return 0 if head.phase is Phase.COMPLETED else EXIT_FAILED_RUN


def over_api(args: argparse.Namespace) -> ApiClient | None:
    """The API client when the command is to go through the HTTP API (``--api`` or its env)."""
    url = getattr(args, "api", None) or os.environ.get(ENV_API_URL)
    return ApiClient(url, getattr(args, "key", None)) if url else None


def _handle(args: argparse.Namespace) -> RunHandle | ApiRunHandle:
    api = over_api(args)
    return api.handle(args.run_id) if api is not None else Client.from_env().handle(args.run_id)


def submit(args: argparse.Namespace) -> int:
    api = over_api(args)
    handle: RunHandle | ApiRunHandle
    if api is not None:
        if args.no_check:
            raise InvalidRequest("--no-check needs Redis access: the API refuses runs no live worker serves")
        if args.tenant:
            raise InvalidRequest("--tenant is for Redis: over the API the key's tenant is the one")
        name, version = _assistant_arg(args.assistant)
        handle = api.submit(
            args.agent,
            args.text,
            model=args.model,
            thread_id=args.thread,
            namespace=args.namespace,
            thread_policy=args.thread_policy,
            assistant=name,
            assistant_version=version,
        )
    else:
        name, version = _assistant_arg(args.assistant)
        handle = Client.from_env().submit(
            args.agent,
            args.text,
            model=args.model,
            thread_id=args.thread,
            check_agent=not args.no_check,
            namespace=args.namespace,
            thread_policy=args.thread_policy,
            tenant=args.tenant,
            assistant=name,
            assistant_version=version,
        )
    return _started(handle, args)


def _assistant_arg(text: str | None) -> tuple[str | None, int | None]:
    """``--assistant NAME[@VERSION]`` as its name and version."""
    name, _, version = (text or "").partition("@")
    if version and not version.isdigit():
        raise InvalidRequest(f"--assistant {text!r}: the version after @ is a number")
    return name or None, int(version) if version else None


def _started(handle: RunHandle | ApiRunHandle, args: argparse.Namespace) -> int:
    """Print a new run's id, or (``--wait``) follow it to its end."""
    if not args.wait:
        print(json.dumps({"run_id": handle.run_id}) if args.json else handle.run_id)
        return 0
    if not args.json:
        print(f"run {handle.run_id}", file=sys.stderr)
    _follow(handle, args.timeout, args.json)
    head = handle.status()
    if not head.terminal:
        print(
            f"wesichain: run {handle.run_id} still {head.phase.value} after {args.timeout:g}s",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return _finish(head, args.json)


def checkpoints(args: argparse.Namespace) -> int:
    listed = Client.from_env().checkpoints(args.run_id)
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in listed]))
        return 0
    print(f"{'version':>7}  {'step':>4}  {'phase':<17}  {'committed at (UTC)':<23}  worker")
    for c in listed:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.at)) + f".{int(c.at * 1000) % 1000:03d}"
        retried = f"  (attempt {c.attempt})" if c.attempt > 1 else ""
        print(f"{c.version:>7}  {c.step:>4}  {c.phase.value:<17}  {at:<23}  {c.worker or '-'}{retried}")
    return 0


def fork(args: argparse.Namespace) -> int:
    client = Client.from_env()
    handle = client.fork(args.run_id, args.version, input=args.input, model=args.model)
    if not args.json:
        print(f"forked {args.run_id} v{args.version}", file=sys.stderr)
    return _started(handle, args)


def retry(args: argparse.Namespace) -> int:
    """A fresh run with an ended run's request (over the API, or straight to Redis)."""
    api = over_api(args)
    handle: RunHandle | ApiRunHandle
    if api is not None:
        handle = api.handle(args.run_id).retry()
    else:
        client = Client.from_env()
        source = client.handle(args.run_id).status()
        if not source.terminal:
            raise InvalidRequest(f"run {args.run_id} has not ended ({source.status})")
        handle = client.retry(source)
    if not args.json:
        print(f"retried {args.run_id}", file=sys.stderr)
    return _started(handle, args)


def children(args: argparse.Namespace) -> int:
    """A run's subagent runs, one a line (or a JSON list)."""
    api = over_api(args)
    listed = (
        [(v.run_id, v.agent, v.status, v.parent) for v in api.handle(args.run_id).children()]
        if api is not None
        else [(h.run_id, h.agent, h.status, h.parent) for h in Client.from_env().children(args.run_id)]
    )
    if args.json:
        rows = [
            {"run_id": run_id, "agent": agent, "status": status, "step": p.step if p else None,
             "call_id": p.call_id if p else None}
            for run_id, agent, status, p in listed
        ]  # fmt: skip
        print(json.dumps(rows))
        return 0
    for run_id, agent, status, p in listed:
        print(f"{run_id}  {agent}  {status}  step {p.step if p else '?'} call {p.call_id if p else '?'}")
    return 0


def _follow(handle: RunHandle | ApiRunHandle, timeout: float, as_json: bool) -> None:
    """Print the run's events until its end or ``timeout``; if nothing happens for a while, say why."""
    deadline = time.monotonic() + timeout
    after = "0-0"
    told = False
    while (left := deadline - time.monotonic()) > 0:
        for event in handle.events(after=after, idle_timeout=min(QUIET_S, left)):
            print_event(event, as_json)
            after = event.stream_id or after
            if event.kind in END_EVENTS:
                return
        if handle.status().terminal:
            return
        if not told and (reason := handle.why_waiting()):
            print(f"wesichain: run {handle.run_id} {reason}", file=sys.stderr, flush=True)
            told = True


def status(args: argparse.Namespace) -> int:
    api = over_api(args)
    if api is not None:
        handle = api.handle(args.run_id)
        head = handle.status()
        print(head.model_dump_json() if args.json else render_head(head))
        if not args.json and (reason := handle.why_waiting()) is not None:
            print(f"waiting  {reason}")
        return 0
    client = Client.from_env()
    head = client.handle(args.run_id).status()
    print(head.model_dump_json() if args.json else render_head(head))
    if not args.json and (reason := waiting_for(head, client.workers.live())) is not None:
        print(f"waiting  {reason}")
    throttled = client.store.throttled(head.run_id)
    if not args.json and throttled is not None and not head.terminal:
        info, count = throttled
        if info.get("version") == head.version:
            print(
                f"throttled: {info.get('reason')} on {info.get('limit')}, waiting for provider capacity"
                f" ({count} time(s) so far)"
            )
    waiting = client.store.thread_wait(head.run_id) if head.thread_id is not None else None
    if not args.json and waiting is not None and not head.terminal:
        previous = waiting["waiting_for"]
        print(f"waiting for run {previous} of thread {head.thread_id} to end (parked, no worker held)")
    return 0


def events(args: argparse.Namespace) -> int:
    handle = _handle(args)
    handle.status()  # raises RunNotFound for a bad id instead of waiting forever
    for event in handle.events(follow=args.follow, after=args.after):
        print_event(event, args.json)
    return 0


def timeline(args: argparse.Namespace) -> int:
    api = over_api(args)
    handle = api.handle(args.run_id) if api is not None else Client.from_env().handle(args.run_id)
    picture = handle.timeline()
    if args.json:
        print(picture.model_dump_json())
        return 0
    from rich.console import Console

    from producer.timeline_view import render_timeline

    # Into a pipe or file rich would assume 80 columns and break the lanes and rows; there nothing
    # should wrap (a terminal keeps its own width, and $COLUMNS is honoured by rich either way).
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else UNWRAPPED_WIDTH
    Console(highlight=False, width=wide).print(render_timeline(picture, width=max(20, args.width)))
    return 0


def export(args: argparse.Namespace) -> int:
    """The run whole as one JSON document (Redis or the archive), to a file or stdout."""
    from shared.export import export_run

    client = Client.from_env()
    try:
        exported = export_run(client.store, args.run_id)
    finally:
        client.close()
    if exported is None:
        raise RunNotFound(f"no run {args.run_id!r}")
    document = exported.model_dump_json(indent=2 if args.indent else None)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(document + "\n")
        print(f"run {args.run_id} exported to {args.output}", file=sys.stderr)
    else:
        print(document)
    return 0


def cancel(args: argparse.Namespace) -> int:
    phase = _handle(args).cancel()
    if phase is None:
        print(f"wesichain: no run {args.run_id!r}", file=sys.stderr)
        return EXIT_FAILED_RUN
    print(f"cancel requested (run was {phase.value})" if not phase.terminal else f"run already {phase.value}")
    return 0


def _decider(args: argparse.Namespace) -> str:
    """Who decides, for the run's history: ``--by``, else the OS user (the API names the key)."""
    if args.by:
        return str(args.by)
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (some containers)
        return f"uid {os.getuid()}"


def approve(args: argparse.Namespace) -> int:
    handle = _handle(args)
    if isinstance(handle, RunHandle):
        handle.approve(args.note, always=args.always, by=_decider(args))
    else:  # the API records the caller's key as who decided
        handle.approve(args.note, always=args.always)
    print(f"approved{' for the rest of the run' if args.always else ''}; run {args.run_id} resumes")
    return 0


def deny(args: argparse.Namespace) -> int:
    handle = _handle(args)
    if isinstance(handle, RunHandle):
        handle.deny(args.note, by=_decider(args))
    else:
        handle.deny(args.note)
    print(f"denied; run {args.run_id} resumes without the denied calls")
    return 0


def send(args: argparse.Namespace) -> int:
    """Send a user message into a running run; prints the signal's id."""
    handle = _handle(args)
    if isinstance(handle, RunHandle):
        sent = handle.send_message(args.text, key=args.idempotency_key, by=_decider(args))
    else:  # the API records the caller's key as the sender
        sent = handle.send_message(args.text, key=args.idempotency_key)
    return _print_signal(sent, args.json)


def update(args: argparse.Namespace) -> int:
    """Send a state update and wait for its outcome; exit 1 when it was rejected (or discarded)."""
    try:
        patch = json.loads(args.patch)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the update is not JSON: {exc}") from None
    wait = args.wait if args.wait > 0 else None
    handle = _handle(args)
    if isinstance(handle, RunHandle):
        sent = handle.update(patch, key=args.idempotency_key, wait=wait, by=_decider(args))
    else:
        sent = handle.update(patch, key=args.idempotency_key, wait=wait)
    return _print_signal(sent, args.json)


def _print_signal(sent: SignalView, as_json: bool) -> int:
    if as_json:
        print(sent.model_dump_json())
    else:
        again = " (sent before under this key)" if sent.duplicate else ""
        error = f": {sent.error}" if sent.error else ""
        print(f"{sent.kind} #{sent.id} of run {sent.run_id}: {sent.status}{again}{error}")
    return EXIT_FAILED_RUN if sent.status in ("rejected", "discarded") else 0


def agents(args: argparse.Namespace) -> int:
    api = over_api(args)
    if api is not None:
        return _agents_over_api(api, args.json)
    client = Client.from_env()
    live = client.workers.live()
    served: dict[str, list[str]] = {}
    infos: dict[str, AgentInfo] = {}
    for worker in live:
        if worker.record.consuming:
            for agent in worker.record.agents:
                served.setdefault(agent.name, []).append(worker.record.id)
                infos.setdefault(agent.name, agent)
    if args.json:
        print(
            json.dumps(
                [{**infos[n].model_dump(mode="json"), "workers": sorted(served[n])} for n in sorted(infos)]
            )
        )
        return 0
    if not infos:
        print("no live worker serves any agent", file=sys.stderr)
        return EXIT_FAILED_RUN
    for name in sorted(infos):
        agent = infos[name]
        tools = ", ".join(t.name for t in agent.tools) or "no tools"
        print(
            f"{name} v{agent.version}  model {agent.model}  tools: {tools}{_handoffs_of(agent)}"
            f"  ({len(served[name])} worker(s))"
        )
    return 0


def _handoffs_of(agent: AgentInfo) -> str:
    """The agents it may hand the conversation to, for the one-line listing ("" for none)."""
    targets = list(dict.fromkeys(h.agent for h in agent.handoffs))
    return f"  hands off to: {', '.join(targets)}" if targets else ""


def _agents_over_api(api: ApiClient, as_json: bool) -> int:
    listed = api.agents()
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in listed]))
        return 0
    if not listed:
        print("no live worker serves any agent", file=sys.stderr)
        return EXIT_FAILED_RUN
    for view in listed:
        tools = ", ".join(t.name for t in view.tools) or "no tools"
        print(
            f"{view.name} v{view.version}  model {view.model}  tools: {tools}{_handoffs_of(view)}"
            f"  ({view.workers} worker(s))"
        )
    return 0


def workers(args: argparse.Namespace) -> int:
    command = getattr(args, "workers_command", None)
    if command == "drain":
        return drain(args)
    if command == "versions" and (api := over_api(args)) is not None:
        return _versions_over_api(api, args.json)
    if command == "pool":
        return _pool(args)
    client = Client.from_env()
    if command == "versions":
        listed = client.versions()
        if args.json:
            print(json.dumps([{**asdict(v), "waiting": v.waiting} for v in listed]))
        else:
            _print_versions(listed)
        return 0
    live = client.workers.live()
    if args.json:
        print(json.dumps([{**w.record.model_dump(mode="json"), "age_s": round(w.age_s, 2)} for w in live]))
        return 0
    for w in live:
        r = w.record
        served = " ".join(f"{a.name}:v{a.version}" for a in r.agents) or "no agents"
        print(
            f"{r.id}  {r.pool} x{r.concurrency}  serves {served}  {r.consumer_state}"
            f"{'  DRAINING' if r.draining else ''}  (seen {w.age_s:.1f}s ago)"
        )
    print()
    _print_versions(client.versions())
    return 0


def _pool(args: argparse.Namespace) -> int:
    """``wesichain workers pool``: the operator view (over the API, what the key may see)."""
    if not 1 <= args.minutes <= MAX_SERIES_MINUTES:
        print(f"wesichain: --minutes must be in 1..{MAX_SERIES_MINUTES}", file=sys.stderr)
        return 2
    api = over_api(args)
    view = api.pool(args.minutes) if api is not None else Client.from_env().pool(minutes=args.minutes)
    if args.json:
        print(view.model_dump_json())
        return 0
    print(
        f"{view.worker_count} live worker(s), {view.consuming_workers} consuming;"
        f" slots {view.slots_in_use}/{view.slots} in use ({view.scope} view)"
    )
    for w in view.workers:
        print(
            f"  {w.id}  {w.pool} {w.busy}/{w.concurrency} busy  queues {','.join(w.queues)}"
            f"  serves {' '.join(w.agents) or 'no agents'}  {w.consumer_state}"
            f"{'  DRAINING' if w.draining else ''}  (seen {w.heartbeat_age_s:.1f}s ago)"
        )
    for q in view.queues:
        print(f"  queue {q.queue}: {'unknown' if q.depth is None else q.depth}")
    due = "" if view.leases_due is None else f", {view.leases_due} due"
    p = view.parked
    print(f"in flight {view.in_flight}; leases {view.leases}{due}")
    print(
        f"parked: approval {p.approval} (subagents {p.subagents}), thread {p.thread}, version {p.version}"
        f"{' (partial)' if p.partial else ''}"
    )
    ended = {k: sum(getattr(m, k) for m in view.throughput) for k in ("completed", "failed", "interrupted")}
    print(f"last {len(view.throughput)} min: " + ", ".join(f"{v} {k}" for k, v in ended.items()))
    for d in view.deaths:
        print(
            f"  dead: {d.worker} at {time.strftime('%H:%M:%S', time.localtime(d.at))} ({d.claims} claim(s))"
        )
    return 0


def _versions_over_api(api: ApiClient, as_json: bool) -> int:
    """``wesichain workers versions --api``: the versions live in the pool, with the key's tenant's
    runs only (the API's ``GET /v1/versions``)."""
    listed = api.versions()
    if as_json:
        print(json.dumps([v.model_dump(mode="json") for v in listed]))
        return 0
    _print_versions(
        [VersionLoad(v.agent, v.version, v.workers, v.draining, v.active_runs, v.parked_runs) for v in listed]
    )
    return 0


def _print_versions(loads: list[VersionLoad]) -> None:
    print(f"{'agent version':<32} {'workers':>7} {'draining':>8} {'active runs':>11} {'parked':>6}")
    for v in loads:
        label = f"{v.agent} v{v.version}"
        note = f"  {waiting_reason(v.agent, v.version)}" if v.waiting else ""
        print(f"{label:<32} {v.workers:>7} {v.draining:>8} {v.active:>11} {v.parked:>6}{note}")


def drain(args: argparse.Namespace) -> int:
    """``wesichain workers drain``: ask a worker, or an agent version's workers, to drain."""
    agent = version = None
    if args.agent_version:
        agent, _, version = str(args.agent_version).rpartition(":")
        if not agent or not version:
            raise InvalidRequest("--version takes AGENT:VERSION, e.g. research:1")
    if bool(args.worker) == bool(agent):
        raise InvalidRequest("name a worker, or give --version AGENT:VERSION (one of them)")
    target = Client.from_env().drain(args.worker, agent=agent, version=version, cancel=args.cancel)
    print(f"drain {'cancelled' if args.cancel else 'requested'}: {target}")
    return 0


def health(args: argparse.Namespace) -> int:
    """A probe: 0 when the worker (or every worker of this host) is live and consuming."""
    live = Client.from_env().workers.live()
    if args.worker:
        mine = [w for w in live if w.record.id == args.worker]
        what = f"worker {args.worker}"
    else:
        host = socket.gethostname()
        mine = [w for w in live if w.record.host == host or w.record.id.endswith(f"@{host}")]
        what = f"no worker of host {host}"
    if not mine:
        print(
            f"unhealthy: {what} is not live (no heartbeat)" if args.worker else f"unhealthy: {what} is live"
        )
        return EXIT_FAILED_RUN
    bad = [w for w in mine if not w.record.consuming]
    for w in mine:
        print(f"{w.record.id}: {w.record.consumer_state}")
    return EXIT_FAILED_RUN if bad else 0
