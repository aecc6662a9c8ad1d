"""Custom events in the embedded mode (in-memory broker, in-process Redis stand-in, in-process
worker): a tool's progress is appended, fenced by its claim, with its call id and attempt, before the
call's result, and read back as every other event is."""

from __future__ import annotations

import pytest

from shared.events import CustomEvent, ToolCompleted, ToolDispatched
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL
from shared.state import Phase
from worker.embedded import embedded


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)


def test_a_tools_progress_in_the_embedded_mode() -> None:
    with embedded("tests.agents_reliability") as client:
        handle = client.submit("progress_embedded", "go", check_agent=False)
        head = handle.wait(timeout=60)
        assert head.phase is Phase.COMPLETED and head.answer == "progress reported", head.error
        events = [e for e in handle.events(follow=False) if e.kind != "TokenDelta"]
        only_custom = list(handle.events(follow=False, kinds={"CustomEvent"}))
    (dispatched,) = [e for e in events if isinstance(e, ToolDispatched)]
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    custom = [e for e in events if isinstance(e, CustomEvent)]
    assert [(e.name, e.data) for e in custom] == [("progress", {"done": i, "of": 3}) for i in (1, 2, 3)]
    assert {(e.step, e.call_id, e.tool, e.attempt) for e in custom} == {
        (1, dispatched.call_id, "report_progress", 1)
    }
    # Between the call's dispatch and its result, and nothing voided or dropped.
    assert events.index(dispatched) < events.index(custom[0])
    assert events.index(custom[-1]) < events.index(completed)
    assert completed.ok and completed.output == "3 steps reported"
    assert not [e for e in events if e.kind in ("CustomEventsVoided", "CustomEventsDropped")]
    # Filtered by kind: the custom events and the run's end event.
    assert [e.kind for e in only_custom] == ["CustomEvent"] * 3 + ["Completed"]
