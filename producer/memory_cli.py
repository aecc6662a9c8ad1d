"""``wesichain memory put|get|rm|ls|search|export|archived``: a tenant's long-term memory
(``shared/memory.py``).

A namespace is written with ``/`` between its labels (``users/u-42``; labels hold no ``/``).
With ``--api`` (or ``$WESICHAIN_API_URL``) the commands go through the HTTP API as the key's
tenant; otherwise straight to Redis, as ``--tenant`` (none: the memory of runs without a tenant).
``export`` and ``archived`` are the operator's, on Redis and the archive database
(``shared/memory_archive.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from producer.api_client import ApiMemory
from producer.client import Client
from producer.commands import over_api
from shared.errors import InvalidRequest
from shared.memory import Memory
from shared.memory_archive import MemoryExport, export_memory
from shared.tenants import Tenants

__all__ = ["memory", "register"]


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Callable[[argparse.Namespace], int]]:
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--api", metavar="URL", help="use the HTTP API at URL (default $WESICHAIN_API_URL)")
    where.add_argument("--key", metavar="KEY", help="the API key (default $WESICHAIN_API_KEY)")
    where.add_argument("--tenant", help="without the API: whose memory (default: runs without a tenant)")
    parents = [common, where]
    m = sub.add_parser("memory", parents=parents, help="read and write a tenant's long-term memory")
    verbs = m.add_subparsers(dest="memory_command", required=True)
    put = verbs.add_parser("put", parents=parents, help="store a JSON object under NAMESPACE and KEY")
    put.add_argument("namespace", help="labels separated by /, e.g. users/u-42")
    put.add_argument("key")
    put.add_argument("value", help="a JSON object")
    put.add_argument("--ttl", type=float, metavar="S", help="expire it after S seconds")
    get = verbs.add_parser("get", parents=parents, help="print an item as JSON")
    get.add_argument("namespace")
    get.add_argument("key")
    rm = verbs.add_parser("rm", parents=parents, help="delete an item")
    rm.add_argument("namespace")
    rm.add_argument("key")
    ls = verbs.add_parser("ls", parents=parents, help="list the namespaces holding items")
    ls.add_argument("prefix", nargs="?", default="", help="only under this namespace prefix")
    ls.add_argument("--depth", type=int, help="cut namespaces to this many labels")
    se = verbs.add_parser("search", parents=parents, help="items under a prefix matching a text query")
    se.add_argument("prefix", nargs="?", default="")
    se.add_argument("--query", "-q", help="every word must appear in the value (any case)")
    se.add_argument("--filter", help='top-level fields the value must equal, as JSON: {"kind": "fact"}')
    se.add_argument("--limit", type=int, default=10, help="items to print, at most 100 (default 10)")
    se.add_argument("--offset", type=int, default=0, help="matches to skip first (default 0)")
    se.add_argument(
        "--semantic",
        action="store_true",
        help="rank by similarity to --query (needs WESICHAIN_MEMORY_EMBEDDING where the search runs)",
    )
    ex = verbs.add_parser(
        "export", parents=parents, help="copy the tenant's items to the archive database now (no --api)"
    )
    ex.add_argument("--all", action="store_true", help="every tenant's memory, and that of runs without one")
    ar = verbs.add_parser(
        "archived", parents=parents, help="items in the archive database, kept after they expired (no --api)"
    )
    ar.add_argument("prefix", nargs="?", default="", help="only under this namespace prefix")
    ar.add_argument("--limit", type=int, default=100, help="items to print, at most 1000 (default 100)")
    return {"memory": memory}


def _labels(text: str) -> list[str]:
    return [label for label in text.split("/") if label]


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be JSON") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value


def _store(args: argparse.Namespace) -> Memory | ApiMemory:
    api = over_api(args)
    if api is not None:
        if args.tenant:
            raise InvalidRequest("--tenant is for Redis: over the API the key's tenant is the one")
        return api.memory
    client = Client.from_env()
    return client.memory_for(args.tenant) if args.tenant else client.memory


def _archive_command(args: argparse.Namespace) -> int:
    if over_api(args) is not None:
        raise InvalidRequest(
            f"memory {args.memory_command} reads Redis and the archive: run it without --api"
        )
    client = Client.from_env()
    archive = client.store.archive
    if archive is None:
        raise InvalidRequest("no archive is configured (WESICHAIN_ARCHIVE_URL)")
    if args.memory_command == "archived":
        if not 1 <= args.limit <= 1000:
            raise InvalidRequest("--limit is 1..1000")
        for item in archive.memory_items(args.tenant, _labels(args.prefix), limit=args.limit):
            print(item.model_dump_json(exclude={"score"}))
        return 0
    tenants = [None, *Tenants(client.store.redis, client.store.keys).names()] if args.all else [args.tenant]
    total = MemoryExport()
    for tenant in tenants:
        total.add(export_memory(client.memory_for(tenant) if tenant else client.memory, archive))
    print(json.dumps(asdict(total)))
    return 0


def memory(args: argparse.Namespace) -> int:
    if args.memory_command in ("export", "archived"):
        return _archive_command(args)
    store = _store(args)
    verb = args.memory_command
    if verb == "put":
        item = store.put(_labels(args.namespace), args.key, _object(args.value, "the value"), ttl_s=args.ttl)
        print(item.model_dump_json())
        return 0
    if verb == "get":
        found = store.get(_labels(args.namespace), args.key)
        if found is None:
            print(f"wesichain: no item {args.key!r} in {args.namespace!r}", file=sys.stderr)
            return 1
        print(found.model_dump_json())
        return 0
    if verb == "rm":
        if not store.delete(_labels(args.namespace), args.key):
            print(f"wesichain: no item {args.key!r} in {args.namespace!r}", file=sys.stderr)
            return 1
        return 0
    if verb == "ls":
        for namespace in store.list_namespaces(prefix=_labels(args.prefix), max_depth=args.depth):
            print("/".join(namespace))
        return 0
    where = _object(args.filter, "--filter") if args.filter else None
    result = store.search(
        _labels(args.prefix),
        query=args.query,
        filter=where,
        limit=args.limit,
        offset=args.offset,
        semantic=args.semantic,
    )
    for item in result.items:
        print(item.model_dump_json())
    if result.truncated:
        print("wesichain: the search stopped at its scan bound: narrow the prefix", file=sys.stderr)
    return 0
