"""The Celery floor: a bare app with the runtime's exact Celery configuration.

``celery_config(Settings(redis_url=...))`` gives the same broker options, serializer, late acks,
prefetch, routing, task events and pool settings the runtime's workers use, with no broker key
prefix, as the runtime has by default. The floor must not share queues with the runtime's workers
when both run on one redis-server, so it keeps its broker and its own keys in another Redis
*database* of the same server (:data:`DB`, the runtime uses database 0): only the database number
of the URL differs, every Celery setting is the runtime's.

With ``BENCH_FLOOR=defaults`` the app has Celery's defaults instead, with only late acks and
prefetch 1 (the two settings at-least-once delivery needs), on database :data:`DEFAULTS_DB` and
Celery's default queue: the best a Celery hop can do here, whatever the runtime's broker settings.

Two tasks, each of which only publishes the next one of its chain (as every runtime phase does):

* ``bench.hop``: nothing else, the cost of one Celery hop;
* ``bench.state_hop``: also loads and rewrites a 4 KB pydantic state in Redis (GET + SET), the cost
  of a hop that keeps naive, non-atomic durable state.

The first hop of a chain records when it started and the last when it finished (one Redis write
each); the hops in between touch nothing but the broker. Start a worker with::

    BENCH_REDIS_URL=redis://127.0.0.1:6379/1 celery -A benchmarks.bare worker -P prefork -c 1
"""

from __future__ import annotations

import os
import time
from functools import cache
from urllib.parse import urlsplit

import redis
from celery import Celery
from pydantic import BaseModel

from shared.settings import Settings, celery_config

ENV_URL = "BENCH_REDIS_URL"
#: ``runtime`` (the runtime's Celery configuration, the default) or ``defaults``.
ENV_FLOOR = "BENCH_FLOOR"
#: The Redis database of the floor's broker and keys (the runtime's workers use database 0).
DB = 1
#: The database of the floor under Celery's defaults.
DEFAULTS_DB = 2
#: The queue of the floor under Celery's defaults (Celery's default queue).
DEFAULTS_QUEUE = "celery"
PREFIX = "bare:"
TASK_HOP = "bench.hop"
TASK_STATE_HOP = "bench.state_hop"


def floor_url(url: str, db: int = DB) -> str:
    """The same server as ``url``, database ``db``."""
    parts = urlsplit(url)
    return parts._replace(path=f"/{db}").geturl()


def settings(url: str | None = None) -> Settings:
    """The floor's settings: the runtime's defaults, on its own database (``url`` is the floor's)."""
    return Settings(redis_url=url or os.environ.get(ENV_URL, f"redis://127.0.0.1:6379/{DB}"))


def make_app(url: str | None = None, floor: str | None = None) -> Celery:
    """The floor's app on ``url`` (the floor's database, see :func:`floor_url`)."""
    app = Celery("bench-bare", set_as_current=False)
    if (floor or os.environ.get(ENV_FLOOR, "runtime")) == "defaults":
        broker = url or os.environ.get(ENV_URL, f"redis://127.0.0.1:6379/{DEFAULTS_DB}")
        app.conf.update(broker_url=broker, task_acks_late=True, worker_prefetch_multiplier=1)
    else:
        app.conf.update(celery_config(settings(url)))
    return app


app = make_app()


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(str(app.conf.broker_url), decode_responses=True)


def start_key(chain: str) -> str:
    return f"{PREFIX}chain:{chain}:start"


def end_key(chain: str) -> str:
    return f"{PREFIX}chain:{chain}:end"


def state_key(chain: str) -> str:
    return f"{PREFIX}chain:{chain}:state"


class Item(BaseModel):
    key: str
    value: str
    score: float


class ChainState(BaseModel):
    """About 4 KB of JSON: a counter and a list of small records, like a run's head."""

    chain: str
    hop: int = 0
    updated_at: float = 0.0
    items: list[Item]


def initial_state(chain: str) -> ChainState:
    items = [Item(key=f"k{i:03d}", value="v" * 32, score=i / 7) for i in range(50)]
    return ChainState(chain=chain, items=items)


def _mark(chain: str, hop: int, total: int) -> None:
    if hop == 0:
        _redis().set(start_key(chain), f"{time.time():.6f}", ex=3600)
    if hop == total - 1:
        _redis().set(end_key(chain), f"{time.time():.6f}", ex=3600)


def _next(name: str, chain: str, hop: int, total: int) -> None:
    if hop + 1 < total:
        app.send_task(
            name,
            kwargs={"chain": chain, "hop": hop + 1, "total": total},
            task_id=f"{chain}:h{hop + 1}",
        )


@app.task(name=TASK_HOP, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
def hop(chain: str, hop: int, total: int) -> None:
    _mark(chain, hop, total)
    _next(TASK_HOP, chain, hop, total)


@app.task(name=TASK_STATE_HOP, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
def state_hop(chain: str, hop: int, total: int) -> None:
    _mark(chain, hop, total)
    client = _redis()
    key = state_key(chain)
    state = ChainState.model_validate_json(client.get(key) or initial_state(chain).model_dump_json())
    state.hop = hop
    state.updated_at = time.time()
    client.set(key, state.model_dump_json(), ex=3600)
    _next(TASK_STATE_HOP, chain, hop, total)
