"""Micro-benchmarks of what one transition is made of, in one process against a real redis-server.

    python -m benchmarks.micro [--n 400] [--out DIR]

Times (wall microseconds per call: the lowest of 5 block medians over ``n`` calls) the store
operations a phase task performs, the Celery publish of the next task with the runtime's
configuration, and the pydantic work around them, at step 1 and at step 50 of a run (the think
phase reads the whole conversation). Writes
``results/micro.json`` and prints a table. No worker runs: this isolates the runtime's own costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from benchmarks.harness import RedisServer
from shared import fsm
from shared.messages import MESSAGE_ADAPTER, SystemMessage, ToolCall, UserMessage, dump_message
from shared.settings import Settings, celery_config
from shared.state import Phase, RunHead, ToolResult
from shared.store import RunStore
from shared.tasks import observe_task, task_for

RESULTS = Path(__file__).resolve().parent / "results"


def _time(fn: Callable[[], Any], n: int, blocks: int = 5) -> float:
    """Microseconds per call of ``fn``: the lowest of ``blocks`` block medians (``n`` calls in all).

    The lowest block is the one least disturbed by other load on the machine, as timeit advises.
    """
    for _ in range(min(20, n)):
        fn()
    best = float("inf")
    for _ in range(blocks):
        samples = []
        for _ in range(max(1, n // blocks)):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e6)
        best = min(best, statistics.median(samples))
    return round(best, 1)


def _make_run(store: RunStore, steps: int) -> tuple[RunHead, str]:
    """A run committed through ``steps`` one-tool steps, left THINKING (as the think task finds it)."""
    run_id = uuid.uuid4().hex
    head = RunHead.new_idle(run_id, "long", f"steps={steps}")
    assert store.commit(None, head) == "committed"
    idle = fsm.view(head)
    assert isinstance(idle, fsm.Idle)
    t = idle.start(
        [SystemMessage(content="benchmark agent long"), UserMessage(content=f"steps={steps}")],
        agent_version="1",
        model="scripted:long",
        max_steps=1000,
    )
    assert store.commit(head.version, t.head, t.messages, t.events) == "committed"
    current: Any = t.to
    for step in range(1, steps):
        from shared.llm.base import Usage

        acting = current.act(None, [ToolCall(id="call_0", name="noop", arguments={})], Usage())
        assert store.commit(current.head.version, acting.head, acting.messages, acting.events) == "committed"
        observing = acting.to.observe()
        assert store.commit(acting.head.version, observing.head) == "committed"
        result = ToolResult(call_id="call_0", name="noop", ok=True, output="ok")
        nxt = observing.to.next_step([result])
        assert store.commit(observing.head.version, nxt.head, nxt.messages, nxt.events) == "committed"
        current = nxt.to
        del step
    return current.head, run_id


def _per_step_costs(store: RunStore, steps: int, n: int) -> dict[str, float]:
    r = store.redis
    head, run_id = _make_run(store, steps)
    key = store.keys.messages(run_id)
    count = r.llen(key)
    tag = f"step {steps} ({count} messages)"

    def begin(with_messages: bool) -> Any:
        return store.begin(
            run_id,
            head.version,
            Phase.THINKING,
            0,
            f"{steps}:think",
            with_messages=with_messages,
            takeover=True,
        )

    raw = r.lrange(key, 0, -1)
    msgs = begin(True).messages
    return {
        f"RunStore.begin think, {tag}": _time(lambda: begin(True), n),
        f"RunStore.begin without messages, {tag}": _time(lambda: begin(False), n),
        f"LRANGE messages, {tag}": _time(lambda: r.lrange(key, 0, -1), n),
        f"parse messages (pydantic), {tag}": _time(
            lambda: [MESSAGE_ADAPTER.validate_json(m) for m in raw], n
        ),
        f"dump messages (pydantic), {tag}": _time(lambda: [dump_message(m) for m in msgs], n),
    }


def measure(url: str, n: int) -> dict[str, Any]:
    settings = Settings(redis_url=url, prefix="micro:", agents_module="benchmarks.agents")
    from shared.redis_client import connect

    store = RunStore(connect(settings), settings)
    app = Celery("micro", set_as_current=False)
    app.conf.update(celery_config(settings))
    r = store.redis
    out: dict[str, Any] = {"n": n}
    out["redis PING round trip"] = _time(r.ping, n)
    out["redis HEXISTS (has_result)"] = _time(lambda: r.hexists("micro:x", "y"), n)
    out["celery send_task (next phase publish)"] = _time(
        lambda: app.send_task(
            "wesichain.noop",
            kwargs={"run_id": "x", "step": 1, "version": 2, "epoch": 0},
            task_id=uuid.uuid4().hex,
        ),
        n,
    )
    app_quiet = Celery("micro-quiet", set_as_current=False)
    app_quiet.conf.update({**celery_config(settings), "task_send_sent_event": False})
    out["celery send_task, task_send_sent_event off"] = _time(
        lambda: app_quiet.send_task("wesichain.noop", kwargs={"run_id": "x"}, task_id=uuid.uuid4().hex), n
    )
    r.delete(f"{settings.prefix}celery:wesichain.model")
    for steps in (1, 50):
        out.update(_per_step_costs(store, steps, n))
    # One commit (think -> act) and one fan-in record, each on a fresh run so the CAS succeeds.
    from shared.llm.base import Usage

    heads = []
    for _ in range(n + 20):
        h, rid = _make_run(store, 1)
        thinking = fsm.view(h)
        assert isinstance(thinking, fsm.Thinking)
        heads.append((thinking, rid))
    it = iter(heads)

    def commit_act() -> None:
        thinking, _ = next(it)
        t = thinking.act(None, [ToolCall(id="call_0", name="noop", arguments={})], Usage())
        assert (
            store.commit(thinking.head.version, t.head, t.messages, t.events, task_for(t.head)) == "committed"
        )

    out["fsm act + RunStore.commit (think -> act)"] = _time(commit_act, n)
    h = heads[0][0].head
    out["RunHead.model_validate_json"] = _time(lambda: RunHead.model_validate_json(h.model_dump_json()), n)
    out["RunHead.model_dump_json"] = _time(h.model_dump_json, n)
    out["observe_task + TaskSpec.model_dump_json"] = _time(lambda: observe_task(h).model_dump_json(), n)
    store.redis.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="micro", help="base name of the JSON file")
    args = p.parse_args(argv)
    server = RedisServer().start()
    try:
        out = measure(server.url, args.n)
    finally:
        server.cleanup()
    width = max(len(k) for k in out)
    for k, v in out.items():
        print(f"{k:<{width}}  {v:>9} {'µs' if k != 'n' else ''}")
    args.out.mkdir(parents=True, exist_ok=True)
    import redis.utils

    out["hiredis"] = bool(redis.utils.HIREDIS_AVAILABLE)
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
