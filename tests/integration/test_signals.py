"""Messages and state updates sent into a running run, on real workers (``shared/signals.py``):
applied in order at the next think, once; updates validated against the run's state type and
answered with the outcome; idempotent by key; refused by ended runs; a parked run woken by a
message when its agent allows it."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from producer.cli import main
from producer.client import Client, RequestConflict, RunHandle, SignalRefused
from shared import protocol
from shared.errors import InvalidRequest
from shared.messages import UserMessage
from shared.signals import SignalView
from shared.state import Phase
from tests.agents_fixture import EFFECTS_KEY, HOLDING_KEY, RELEASE_KEY, Inbox
from tests.broker import broker_env
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 30


def _holding(client: Client, run_id: str) -> None:
    wait_until(lambda: client.store.redis.exists(HOLDING_KEY + run_id), TIMEOUT, what="the hold call to run")


def _release(client: Client, run_id: str) -> None:
    client.store.redis.set(RELEASE_KEY + run_id, "1", ex=3600)


def _parked(handle: RunHandle) -> None:
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")


def test_messages_sent_while_a_tool_runs_are_seen_by_the_next_think_in_order(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("inbox", "go")
    _holding(client, handle.run_id)
    sent = [handle.send_message(text) for text in ("first", "second", "third")]
    assert [s.id for s in sent] == [1, 2, 3]
    assert all(s.status == "pending" and s.kind == "message" for s in sent)
    _release(client, handle.run_id)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "heard: first | second | third"
    assert head.signals_applied == 3
    conversation = client.store.load_messages(handle.run_id)
    users = [m.content for m in conversation if isinstance(m, UserMessage)]
    assert users == ["go", "first", "second", "third"]  # each once, in order, after the tool's result
    assert [handle.signal(s.id).status for s in sent] == ["accepted"] * 3
    events = [e for e in handle.events(follow=False)]
    received = [e.seq for e in events if e.kind == "SignalReceived"]
    applied = [(e.seq, e.accepted) for e in events if e.kind == "SignalApplied"]
    assert received == [1, 2, 3] and applied == [(1, True), (2, True), (3, True)]
    # One commit applied all three: the version that did is each signal's.
    assert len({handle.signal(s.id).version for s in sent}) == 1


def test_an_update_is_validated_committed_and_answered(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("inbox", "go")
    _holding(client, handle.run_id)
    good = handle.update({"priority": 7, "tags": ["vip"]}, wait=None)
    bad = handle.update({"priority": 99}, wait=None)
    assert (good.status, bad.status) == ("pending", "pending")
    _release(client, handle.run_id)
    accepted = handle.signal(good.id, wait=TIMEOUT)
    rejected = handle.signal(bad.id, wait=TIMEOUT)
    assert accepted.status == "accepted" and accepted.error is None
    assert rejected.status == "rejected"
    assert (
        rejected.error is not None and "priority" in rejected.error and "does not fit Inbox" in rejected.error
    )
    head = handle.wait(TIMEOUT)
    assert head.state_as(Inbox) == Inbox(priority=7, tags=["vip"])  # the rejected one changed nothing
    # The state moved in the commit that applied the update, and is checkpointed from there on.
    moved = next(c for c in client.store.checkpoints(handle.run_id) if c.state == head.state)
    assert moved.version == accepted.version


def _stored(client: Client, run_id: str, seq: int) -> None:
    inbox = client.store.keys.inbox(run_id)
    wait_until(
        lambda: client.store.redis.hexists(inbox, f"s:{seq}"), TIMEOUT, what=f"signal {seq} to be stored"
    )


@pytest.mark.parametrize(
    ("agent", "want", "error"),
    [("inbox", "accepted", None), ("inbox_stateless", "rejected", "declares no state_type")],
)
def test_update_waits_for_its_outcome(
    workers: list[WorkerProcess], client: Client, agent: str, want: str, error: str | None
) -> None:
    handle = client.submit(agent, "go")
    _holding(client, handle.run_id)
    answers: list[SignalView] = []
    waiting = threading.Thread(target=lambda: answers.append(handle.update({"tags": ["late"]}, wait=TIMEOUT)))
    waiting.start()
    _stored(client, handle.run_id, 1)
    _release(client, handle.run_id)  # the call returns once the next think applied it
    waiting.join(TIMEOUT)
    (answer,) = answers
    assert answer.status == want, answer
    assert (answer.error is None) if error is None else (answer.error is not None and error in answer.error)


def test_signals_are_idempotent_by_key(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("inbox", "go")
    _holding(client, handle.run_id)
    first = handle.send_message("only once", key="k-1")
    again = handle.send_message("only once", key="k-1")
    assert again.id == first.id and again.duplicate and not first.duplicate
    with pytest.raises(RequestConflict, match="k-1"):
        handle.send_message("another text", key="k-1")
    with pytest.raises(RequestConflict):
        handle.update({"priority": 1}, key="k-1", wait=None)
    _release(client, handle.run_id)
    head = handle.wait(TIMEOUT)
    assert head.answer == "heard: only once"
    # After the end, the key still answers its signal; a new signal is refused.
    assert handle.send_message("only once", key="k-1").status == "accepted"
    with pytest.raises(SignalRefused) as refused:
        handle.send_message("too late")
    assert refused.value.code == "run_ended"


def test_bad_signals_are_refused_before_anything_is_stored(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("inbox", "go")
    _holding(client, handle.run_id)
    for bad in ("", "   "):
        with pytest.raises(InvalidRequest, match="non-blank"):
            handle.send_message(bad)
    with pytest.raises(InvalidRequest, match="characters, over the limit"):
        handle.send_message("x" * (client.settings.limits.max_message_chars + 1))
    with pytest.raises(InvalidRequest, match="non-empty JSON object"):
        handle.update({}, wait=None)
    with pytest.raises(InvalidRequest, match="bytes as JSON"):
        handle.update({"tags": ["y" * 70_000]}, wait=None)
    with pytest.raises(InvalidRequest, match="key"):
        handle.send_message("hi", key="k" * 201)
    assert client.store.redis.exists(client.store.keys.inbox(handle.run_id)) == 0
    _release(client, handle.run_id)
    assert handle.wait(TIMEOUT).answer == "heard: "


def test_a_message_wakes_a_parked_run_whose_agent_allows_it(
    workers: list[WorkerProcess], client: Client
) -> None:
    waking = client.submit("wakes_on_message", "please refund")
    waiting = client.submit("waits_for_decision", "please refund")
    for parked in (waking, waiting):
        _parked(parked)
        parked.send_message("never mind, cancel the refund")
    head = waking.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    assert head.answer == "woken by never mind, cancel the refund; denied"
    assert client.store.redis.hget(EFFECTS_KEY, f"{waking.run_id}:1:call_0") is None  # the call never ran
    decided = [e for e in waking.events(follow=False) if e.kind == "ApprovalDecided"]
    assert len(decided) == 1 and decided[0].by == "message" and not decided[0].approve
    # Without wake_on_message the message waits for the human's decision.
    assert waiting.status().phase is Phase.AWAITING_APPROVAL
    assert waiting.signal(1).status == "pending"
    waiting.approve()
    done = waiting.wait(TIMEOUT)
    assert done.answer == "woken by never mind, cancel the refund; ran"
    assert waiting.signal(1).status == "accepted"


def test_many_messages_into_a_parked_run_that_waits_for_its_human_do_not_fail_it(
    workers: list[WorkerProcess], client: Client
) -> None:
    waiting = client.submit("waits_for_decision", "please refund")
    _parked(waiting)
    # Each message sends a decide, which finds no decision and gives the run back: once counted as
    # an attempt of the decide, the sixth failed the run as poison.
    sent = client.settings.max_phase_attempts + 3
    for i in range(sent):
        waiting.send_message(f"still there? {i}")
    decided = protocol.attempts_field(waiting.status().version, protocol.RUNNING)

    def every_decide_given_back() -> bool:
        # Each decide's claim is taken back out of the attempts as it gives the run back.
        return client.store.attempts(waiting.run_id).get(decided) == "0"

    wait_until(every_decide_given_back, TIMEOUT, what="the decides to find no decision")
    assert waiting.status().phase is Phase.AWAITING_APPROVAL
    waiting.approve()
    done = waiting.wait(TIMEOUT)
    assert done.phase is Phase.COMPLETED, done.error
    assert [waiting.signal(n).status for n in range(1, sent + 1)] == ["accepted"] * sent


def test_a_message_sent_while_the_parking_think_asks_the_model_wakes_the_run(
    workers: list[WorkerProcess], client: Client
) -> None:
    token = uuid.uuid4().hex
    handle = client.submit("wakes_after_held_think", token)
    wait_until(lambda: client.store.redis.exists(HOLDING_KEY + token), TIMEOUT, what="the model call")
    sent = handle.send_message("stop, wrong order")  # the run is thinking: the sender wakes nothing
    client.store.redis.set(RELEASE_KEY + token, "1", ex=3600)
    head = handle.wait(TIMEOUT)  # the think that parked it saw the message pending and woke it
    assert head.answer == "woken by stop, wrong order; denied"
    assert handle.signal(sent.id).status == "accepted"


def test_cli_send_and_update(
    workers: list[WorkerProcess],
    client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in broker_env(client.settings.redis_url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)
    handle = client.submit("inbox", "go")
    _holding(client, handle.run_id)
    url = ["--redis", client.settings.redis_url, "--agents", "tests.agents_fixture"]
    assert main(["send", handle.run_id, "from the terminal", "--idempotency-key", "t1", *url]) == 0
    assert capsys.readouterr().out == f"message #1 of run {handle.run_id}: pending\n"
    assert main(["send", handle.run_id, "from the terminal", "--idempotency-key", "t1", "--json", *url]) == 0
    assert json.loads(capsys.readouterr().out)["duplicate"] is True
    assert main(["update", handle.run_id, "{not json", *url]) == 2
    assert "not JSON" in capsys.readouterr().err
    # The update waits for its outcome: the run applies it once released, after it was stored.
    exits: list[int] = []
    waiting = threading.Thread(
        target=lambda: exits.append(main(["update", handle.run_id, '{"priority": 11}', "--wait", "60", *url]))
    )
    waiting.start()
    _stored(client, handle.run_id, 2)
    _release(client, handle.run_id)
    waiting.join(TIMEOUT)
    out = capsys.readouterr().out
    assert exits == [1] and out.startswith(f"update #2 of run {handle.run_id}: rejected: "), out
    assert "priority" in out
    assert handle.wait(TIMEOUT).answer == "heard: from the terminal"
