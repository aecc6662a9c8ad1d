"""``wesichain api`` (the HTTP server) and ``wesichain keys`` (tenants' API keys), added to
``wesichain`` through the ``wesichain.commands`` entry point group."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.tenants import Tenants

__all__ = ["Handler", "api", "keys", "register"]

Handler = Any


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    a = sub.add_parser("api", parents=[common], help="serve the HTTP API (FastAPI on uvicorn)")
    a.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    a.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    a.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without API keys (development only: refused unless --host is a loopback address)",
    )
    a.add_argument(
        "--max-streams",
        type=int,
        help="event streams one process serves at once (default 1000, WESICHAIN_API_MAX_STREAMS)",
    )
    a.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help="seconds a request's whole body may take to arrive, then 408 (default 30,"
        " WESICHAIN_API_BODY_TIMEOUT_S)",
    )
    a.add_argument(
        "--head-timeout",
        type=float,
        metavar="SECONDS",
        help="seconds a request's line and headers may take to arrive, then the connection is closed"
        " (default 10, WESICHAIN_API_HEAD_TIMEOUT_S)",
    )
    a.add_argument(
        "--max-streams-per-tenant",
        type=int,
        help="event streams one tenant may hold in one process (default a quarter of --max-streams,"
        " WESICHAIN_API_MAX_STREAMS_PER_TENANT)",
    )
    a.add_argument("--openapi", action="store_true", help="print the OpenAPI document and exit")
    a.add_argument("--log-level", default="info", help="uvicorn's log level (default info)")

    k = sub.add_parser("keys", help="create, list and revoke tenants' API keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    c = ksub.add_parser(
        "create", parents=[common], help="create a key (printed once: it is stored only hashed)"
    )
    c.add_argument("--tenant", required=True, help="the tenant the key acts for")
    c.add_argument("--name", default="", help="what the key is for")
    c.add_argument("--json", action="store_true", help="print the key and its id as JSON")
    ls = ksub.add_parser("list", parents=[common], help="a tenant's keys (ids, never the keys)")
    ls.add_argument("--tenant", required=True, help="the tenant whose keys to list")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    r = ksub.add_parser(
        "revoke", parents=[common], help="revoke a key by its id (or a prefix of 8+ characters)"
    )
    r.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    r.add_argument("key_id")
    s = ksub.add_parser(
        "secret", parents=[common], help="print the tenant's webhook signing secret (made on first use)"
    )
    s.add_argument("--tenant", required=True, help="the tenant whose secret to print")
    lim = ksub.add_parser("limits", parents=[common], help="show or set a tenant's limits")
    lim.add_argument("--tenant", required=True, help="the tenant to show or set")
    lim.add_argument("--max-inflight", type=int, help="runs not ended yet")
    lim.add_argument("--submits-per-minute", type=int, help="new runs per minute")
    lim.add_argument("--max-memory-items", type=int, help="items in its long-term memory")
    lim.add_argument(
        "--max-assistant-bytes", type=int, help="bytes its assistants' versions hold (deleted ones' kept too)"
    )
    ns = ksub.add_parser(
        "namespaces",
        parents=[common],
        help="show or set the queue namespaces a tenant's runs may name (the default one always)",
    )
    ns.add_argument("--tenant", required=True, help="the tenant to show or set")
    ns.add_argument("--allow", action="append", default=[], metavar="NAME", help="allow NAME (repeatable)")
    ns.add_argument(
        "--disallow", action="append", default=[], metavar="NAME", help="take NAME back (repeatable)"
    )
    ns.add_argument("--clear", action="store_true", help="allow only the default namespace")
    cc = ksub.add_parser(
        "celery-callbacks",
        parents=[common],
        help="show or set the Celery tasks and queues a tenant's runs may name as their callback",
    )
    cc.add_argument("--tenant", required=True, help="the tenant to show or set")
    for what in ("task", "queue"):
        cc.add_argument(
            f"--allow-{what}",
            action="append",
            default=[],
            metavar="NAME",
            help=f"allow {what} NAME (repeatable)",
        )
        cc.add_argument(
            f"--disallow-{what}",
            action="append",
            default=[],
            metavar="NAME",
            help=f"take {what} NAME back (repeatable)",
        )
    cc.add_argument("--clear", action="store_true", help="allow no Celery callback (webhooks only)")
    md = ksub.add_parser(
        "models",
        parents=[common],
        help="show or set the models a tenant's requests may name for a run (none: its agents' own)",
    )
    md.add_argument("--tenant", required=True, help="the tenant to show or set")
    md.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="MODEL",
        help="allow PROVIDER:MODEL, or every model of a provider with PROVIDER:* (repeatable)",
    )
    md.add_argument(
        "--disallow", action="append", default=[], metavar="MODEL", help="take MODEL back (repeatable)"
    )
    md.add_argument("--clear", action="store_true", help="allow none: runs use their agents' models")
    cb = ksub.add_parser(
        "callback", parents=[common], help="show or set the webhook of a tenant's runs that name none"
    )
    cb.add_argument("--tenant", required=True, help="the tenant to show or set")
    cb.add_argument("--url", help="the webhook URL (http or https)")
    cb.add_argument("--clear", action="store_true", help="remove it")
    op = ksub.add_parser(
        "operator",
        parents=[common],
        help="show or set whether a tenant's keys see the whole worker pool (GET /v1/pool)",
    )
    op.add_argument("--tenant", required=True, help="the tenant to show or set")
    on_off = op.add_mutually_exclusive_group()
    on_off.add_argument("--on", action="store_true", help="its keys see every worker and queue")
    on_off.add_argument("--off", action="store_true", help="its keys see pool-wide counts only")
    return {"api": api, "keys": keys}


def api(args: argparse.Namespace) -> int:
    from producer.api.config import (
        ENV_API_AUTH,
        ENV_API_BODY_TIMEOUT,
        ENV_API_HEAD_TIMEOUT,
        ENV_API_HOST,
        ENV_API_MAX_STREAMS,
        ENV_API_MAX_STREAMS_PER_TENANT,
        ApiConfig,
        head_timeout_from_env,
    )

    if args.openapi:
        from producer.api.app import openapi_document

        print(json.dumps(openapi_document(), indent=2, sort_keys=True))
        return 0
    # Settings travel by environment, so every uvicorn worker process builds the same app.
    os.environ[ENV_API_HOST] = args.host
    if args.max_streams is not None:
        os.environ[ENV_API_MAX_STREAMS] = str(args.max_streams)
    if args.body_timeout is not None:
        os.environ[ENV_API_BODY_TIMEOUT] = str(args.body_timeout)
    if args.head_timeout is not None:
        os.environ[ENV_API_HEAD_TIMEOUT] = str(args.head_timeout)
    if args.max_streams_per_tenant is not None:
        os.environ[ENV_API_MAX_STREAMS_PER_TENANT] = str(args.max_streams_per_tenant)
    if args.no_auth:
        os.environ[ENV_API_AUTH] = "off"
    ApiConfig.from_env()  # refuse bad settings (auth off on a public address) before binding
    head_timeout_from_env()  # the connections' own setting, read apart from the app's
    import uvicorn

    from producer.api.http_protocol import HeadDeadline

    uvicorn.run(
        "producer.api.app:create_app",
        factory=True,
        http=HeadDeadline,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def keys(args: argparse.Namespace) -> int:
    from shared.redis_client import connect
    from shared.settings import Settings
    from shared.store import RunStore
    from shared.tenants import Tenants

    settings = Settings.from_env()
    store = RunStore(connect(settings), settings)
    tenants = Tenants(store.redis, store.keys)
    if args.keys_command == "create":
        key, record = tenants.create_key(args.tenant, args.name)
        if args.json:
            print(json.dumps({"key": key, **record.model_dump(mode="json")}))
        else:
            print(key)
            print(
                f"key id {record.id} for tenant {record.tenant}; the key is not shown again", file=sys.stderr
            )
        return 0
    if args.keys_command == "list":
        records = tenants.keys_of(args.tenant)
        if args.json:
            print(json.dumps([r.model_dump(mode="json") for r in records]))
        for r in records if not args.json else ():
            state = "revoked" if r.revoked_at is not None else "live"
            print(f"{r.id}  {state}  {r.name}")
        return 0
    settings_commands = {
        "limits": _limits,
        "namespaces": _namespaces,
        "celery-callbacks": _celery_callbacks,
        "models": _models,
        "callback": _default_callback,
        "operator": _operator,
    }
    if args.keys_command in settings_commands:
        return settings_commands[args.keys_command](tenants, args)
    if args.keys_command == "secret":
        print(tenants.webhook_secret(args.tenant))
        return 0
    if len(args.key_id) < 8 or not tenants.revoke(args.tenant, args.key_id):
        print(f"wesichain: tenant {args.tenant!r} has no key {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}")
    return 0


def _operator(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys operator``: make the tenant's keys operators' (or not) as asked; print whether."""
    if args.on or args.off:
        tenants.set_operator(args.tenant, args.on)
    print(json.dumps({"tenant": args.tenant, "operator": tenants.is_operator(args.tenant)}))
    return 0


def _namespaces(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys namespaces``: change the tenant's allowed queue namespaces as asked; print them."""
    allowed = set() if args.clear else set(tenants.namespaces(args.tenant))
    if args.clear or args.allow or args.disallow:
        allowed = (allowed | set(args.allow)) - set(args.disallow)
        tenants.set_namespaces(args.tenant, allowed)
    print(json.dumps(list(tenants.namespaces(args.tenant))))
    return 0


def _models(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys models``: change the tenant's allowed models as asked; print them."""
    from shared.errors import InvalidRequest
    from shared.tenants import model_pattern

    now = tenants.models(args.tenant)
    if args.clear or args.allow or args.disallow:
        try:
            # Compared as stored: ``--disallow OpenAI:gpt-4o`` takes back ``openai:gpt-4o``.
            kept = set() if args.clear else set(now)
            added = {model_pattern(raw) for raw in args.allow}
            taken_back = {model_pattern(raw) for raw in args.disallow}
            now = tenants.set_models(args.tenant, (kept | added) - taken_back)
        except InvalidRequest as exc:
            print(f"wesichain: {exc.message}", file=sys.stderr)
            return 2
    print(json.dumps(list(now)))
    return 0


def _default_callback(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys callback``: set or clear the webhook of the tenant's runs that name none; print it."""
    from shared.state import Callback

    if args.clear:
        tenants.set_default_callback(args.tenant, None)
    elif args.url:
        tenants.set_default_callback(args.tenant, Callback(url=args.url).url)
    print(tenants.default_callback(args.tenant) or "none")
    return 0


def _celery_callbacks(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys celery-callbacks``: change the tenant's allowed callback tasks and queues; print them."""
    from shared.errors import InvalidRequest

    now = tenants.celery_callbacks(args.tenant)
    tasks, queues = (set(), set()) if args.clear else (set(now.tasks), set(now.queues))
    if args.clear or args.allow_task or args.disallow_task or args.allow_queue or args.disallow_queue:
        tasks = (tasks | set(args.allow_task)) - set(args.disallow_task)
        queues = (queues | set(args.allow_queue)) - set(args.disallow_queue)
        try:
            now = tenants.set_celery_callbacks(args.tenant, tasks, queues)
        except InvalidRequest as exc:
            print(f"wesichain: {exc.message}", file=sys.stderr)
            return 2
    print(json.dumps({"tasks": list(now.tasks), "queues": list(now.queues)}))
    return 0


def _limits(tenants: Tenants, args: argparse.Namespace) -> int:
    """``keys limits``: change the tenant's limits as asked; print them."""
    from shared.tenants import TenantLimits

    limits = tenants.limits(args.tenant)
    changes = {
        name: value
        for name, value in (
            ("max_inflight", args.max_inflight),
            ("submits_per_minute", args.submits_per_minute),
            ("max_memory_items", args.max_memory_items),
            ("max_assistant_bytes", args.max_assistant_bytes),
        )
        if value is not None
    }
    if changes:
        limits = TenantLimits.model_validate({**limits.model_dump(), **changes})
        tenants.set_limits(args.tenant, limits)
    print(limits.model_dump_json())
    return 0
