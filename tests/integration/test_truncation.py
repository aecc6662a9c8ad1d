"""A final answer the provider cut at its output token limit is never taken silently for a whole
one: the run and its events say so, and the agent's policy accepts it, reprompts or fails."""

from __future__ import annotations

from producer.client import Client
from shared import events as ev
from shared.state import Phase
from tests.agents_fixture import CUT_ANSWER, WHOLE_ANSWER
from tests.harness import WorkerProcess

TIMEOUT = 30


def test_a_cut_answer_is_accepted_and_recorded_by_default(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("cut_accept", "Why does the run survive a crash?")
    head = handle.wait(TIMEOUT)
    assert (head.phase, head.answer, head.truncated) == (Phase.COMPLETED, CUT_ANSWER, True)
    events = list(handle.events(follow=False))
    (responded,) = [e for e in events if isinstance(e, ev.ModelResponded)]
    (completed,) = [e for e in events if isinstance(e, ev.Completed)]
    assert responded.truncated is True and completed.truncated is True
    assert not [e for e in events if isinstance(e, ev.StepFailed)]


def test_a_cut_answer_is_reprompted_once_for_a_whole_one(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("cut_reprompt", "Why does the run survive a crash?")
    head = handle.wait(TIMEOUT)
    assert (head.phase, head.answer, head.truncated) == (Phase.COMPLETED, WHOLE_ANSWER, False)
    assert head.reprompts == 1 and head.steps_used == 2
    events = list(handle.events(follow=False))
    (failed,) = [e for e in events if isinstance(e, ev.StepFailed)]
    assert failed.decision == "reprompt" and failed.error.kind == "InvalidModelAction"
    assert "cut off at the model's output token limit (stop reason 'length')" in failed.error.message
    (responded,) = [e for e in events if isinstance(e, ev.ModelResponded)]
    assert responded.text == WHOLE_ANSWER and responded.truncated is False
    # The model saw its cut answer and was told why it is asked again.
    texts = [m.content for m in client.store.load_messages(handle.run_id)]
    assert CUT_ANSWER in texts and any("cut off" in (t or "") for t in texts)


def test_a_cut_answer_fails_the_run_when_the_policy_says_so(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("cut_fail", "Why does the run survive a crash?")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED and head.answer is None
    assert head.error is not None and head.error.kind == "InvalidModelAction"
    assert "cut off" in head.error.message
    (failed,) = [e for e in handle.events(follow=False) if isinstance(e, ev.StepFailed)]
    assert failed.decision == "fail"
