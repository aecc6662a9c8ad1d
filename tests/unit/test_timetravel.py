"""The conversation a fork starts from, and checkpoints as listed."""

from __future__ import annotations

from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import Phase, PhaseRun, RunHead
from shared.timetravel import Checkpoint, fork_conversation

CALL = ToolCall(id="c1", name="add", arguments={"a": 1})
CONVERSATION: list[Message] = [
    SystemMessage(content="s"),
    UserMessage(content="q1"),
    AssistantMessage(tool_calls=[CALL]),
    ToolMessage(tool_call_id="c1", name="add", content="1"),
    AssistantMessage(content="a1"),
]


def test_a_trailing_answer_or_call_is_dropped_so_the_model_is_asked_again() -> None:
    assert fork_conversation(CONVERSATION, None) == CONVERSATION[:4]
    assert fork_conversation(CONVERSATION[:3], None) == CONVERSATION[:2]
    assert fork_conversation(CONVERSATION[:2], None) == CONVERSATION[:2]
    assert fork_conversation([], None) == []


def test_an_edited_input_replaces_the_last_user_message_and_what_follows() -> None:
    later = [*CONVERSATION, UserMessage(content="q2"), AssistantMessage(content="a2")]
    assert fork_conversation(later, "q2 edited") == [*CONVERSATION, UserMessage(content="q2 edited")]
    assert fork_conversation(CONVERSATION, "other") == [
        SystemMessage(content="s"),
        UserMessage(content="other"),
    ]


def test_a_checkpoint_names_the_worker_that_committed_it() -> None:
    head = RunHead.new_idle("r", "a", "q").model_copy(
        update={
            "version": 3,
            "step": 1,
            "phase": Phase.ACTING,
            "message_count": 3,
            "ran": PhaseRun(phase=Phase.THINKING, host="h1", pid=42, claimed_at=1.0, attempt=2),
        }
    )
    assert Checkpoint.of(head) == Checkpoint(
        version=3, step=1, phase=Phase.ACTING, at=head.updated_at, worker="h1:42", attempt=2, message_count=3
    )
