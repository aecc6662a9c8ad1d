"""The Lua scripts of the run store, loaded once with the protocol prelude prepended."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis

from shared.protocol import lua_prelude

__all__ = ["SCRIPT_NAMES", "is_cluster", "register_scripts", "run_many", "script_source"]

SCRIPT_NAMES = (
    "create",
    "claim_phase",
    "claim_call",
    "renew",
    "release",
    "commit",
    "record_result",
    "record_child",
    "due",
    "inspect",
    "recover",
    "unsent",
    "cancel",
    "decide",
    "join_thread",
    "lock",
    "scan_queue",
    "worker_beat",
    "worker_live",
    "worker_gone",
    "held_claim",
    "finish_callback",
    "throttle",
    "limit_acquire",
    "limit_release",
    "limit_renew",
    "archive_drop",
)


@cache
def script_source(name: str) -> str:
    """A script's source as Redis runs it: the prelude it uses (field names, helpers), then its body."""
    body = resources.files("shared").joinpath("lua", f"{name}.lua").read_text()
    return lua_prelude(body) + body


def register_scripts(client: redis.Redis) -> dict[str, Any]:
    """Every script registered on ``client`` (EVALSHA, reloaded by redis-py after a Redis restart).

    On a cluster they are loaded on every primary at once (``SCRIPT LOAD`` goes to all of them),
    rather than on each primary's first NOSCRIPT reply; a promoted replica still gets them then.
    """
    scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}
    if is_cluster(client):
        for script in scripts.values():
            script.sha = client.script_load(script.script)
    return scripts


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is redis-py's cluster client (``Settings.redis_cluster``)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def run_many(client: Any, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
    """Run ``script`` once per (keys, args): pipelined in one round trip on a standalone Redis.

    redis-py's cluster pipeline refuses scripts (their keys' slots may lie on several primaries),
    so on a cluster they are sent one after the other.
    """
    if not calls:
        return []
    if is_cluster(client):
        return [script(keys=list(keys), args=list(args)) for keys, args in calls]
    with client.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            script(keys=list(keys), args=list(args), client=pipe)
        return list(pipe.execute())
