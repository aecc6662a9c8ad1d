"""Checkpoints and forks (Client and CLI), end to end on a real redis-server and real workers."""

from __future__ import annotations

import json

import pytest

from producer.cli import main
from producer.client import Client
from shared.errors import InvalidRequest
from shared.settings import ENV_AGENTS, ENV_REDIS_URL
from shared.state import ForkOrigin, Phase
from tests.harness import RedisServer

TIMEOUT = 60
PHASES = [
    "idle",
    "thinking",
    "acting",
    "observing",
    "thinking",
    "acting",
    "observing",
    "thinking",
    "completed",
]


def _original(client: Client) -> str:
    head = client.submit("hops", "first question").wait(TIMEOUT)
    assert head.answer == "done: user='first question' results=['1.0', '2.0']"
    return head.run_id


def test_checkpoints_list_every_committed_head(client: Client) -> None:
    run_id = _original(client)
    listed = client.checkpoints(run_id)
    assert [c.phase.value for c in listed] == PHASES
    assert [c.version for c in listed] == list(range(1, 10))
    assert [c.step for c in listed] == [0, 1, 1, 1, 2, 2, 2, 3, 3]
    # A head committed by a phase names its worker; the producer's and the fan-in's do not.
    named = [c.worker.count(":") == 1 for c in listed]
    assert named == [c.phase.value not in ("idle", "observing") for c in listed]
    assert all(a.at <= b.at for a, b in zip(listed, listed[1:], strict=False))


def test_fork_replays_from_a_checkpoint_and_leaves_the_original_alone(client: Client) -> None:
    run_id = _original(client)
    before = (client.store.load_messages(run_id), client.store.checkpoints(run_id))
    # v6: step 2's call was sent; the fork drops that call and thinks step 2 again.
    fork = client.fork(run_id, 6)
    head = fork.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "done: user='first question' results=['1.0', '2.0']"
    assert head.fork == ForkOrigin(run_id=run_id, version=6)
    assert head.step == 2  # one think to redo step 2's call, one to answer
    messages = client.store.load_messages(head.run_id)
    assert messages[:4] == before[0][:4]  # system, user, step 1's call and its result
    assert (client.store.load_messages(run_id), client.store.checkpoints(run_id)) == before


def test_fork_with_another_model_or_an_edited_input(client: Client) -> None:
    run_id = _original(client)
    other = client.fork(run_id, 6, model="scripted:hops_alt").wait(TIMEOUT)
    assert other.answer == "alt: user='first question' results=['1.0']"
    assert other.model == "scripted:hops_alt" and other.fork is not None and other.fork.model_named
    edited = client.fork(run_id, 2, input="second question").wait(TIMEOUT)
    assert edited.answer == "done: user='second question' results=['1.0', '2.0']"
    assert edited.fork == ForkOrigin(run_id=run_id, version=2, edited_input=True)
    with pytest.raises(InvalidRequest, match="has no checkpoint v99 \\(versions: 1..9\\)"):
        client.fork(run_id, 99)


def test_cli_checkpoints_and_fork(
    client: Client, server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = _original(client)
    monkeypatch.setenv(ENV_REDIS_URL, server.url)
    monkeypatch.setenv(ENV_AGENTS, "tests.agents_capabilities")
    assert main(["checkpoints", run_id, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["phase"] for c in listed] == PHASES
    assert main(["checkpoints", run_id]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["version", "step", "phase", "committed", "at", "(UTC)", "worker"]
    assert table[9].split()[:3] == ["9", "3", "completed"]
    assert main(["fork", run_id, "6", "--wait", "--json", "--model", "scripted:hops_alt"]) == 0
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["answer"] == "alt: user='first question' results=['1.0']"
    assert final["fork"] == {"run_id": run_id, "version": 6, "edited_input": False, "model_named": True}
