"""Time travel: a run's committed heads as checkpoints, and new runs forked from any of them.

Every commit of a run keeps its head (the run's checkpoints list), and the head's
``message_count`` says how much of the append-only conversation existed at that version, so any
checkpoint can be replayed: a fork is a new run whose start phase takes the original's
conversation as it was at that version, instead of a fresh one. The original is never touched.

The fork's conversation ends where the model is asked again: a trailing assistant message (tool
calls whose results were not in yet, or a final answer) is dropped, so the fork's first think
redoes that step, possibly with another model. With an edited input, the last user message is
replaced by it and everything after it is dropped.

A fork of a handed-off run goes on under the agent that was in charge at its checkpoint: it keeps
the checkpoint's handoff records whose target's system prompt lies in the replayed conversation
(:func:`forked_handoffs`), so its next think is the last one's target's, with that agent's tools,
policy and prompt, and a later fork or read sees the same handoff history as the original had
there. A handoff whose system prompt an edited input cut off is not kept: the fork goes on under
the agent the conversation it replays belongs to. Its model is the checkpoint's (the agent in
charge there) unless the fork names another.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from shared.messages import AssistantMessage, Message, UserMessage
from shared.state import HandoffRecord, Phase, RunHead

__all__ = ["Checkpoint", "checkpoint_of", "fork_conversation", "forked_handoffs", "last_good_checkpoint"]


class Checkpoint(BaseModel):
    """One committed head of a run: what it was, when, and which worker committed it."""

    version: int
    step: int
    phase: Phase
    #: When it was committed (the committing worker's clock).
    at: float
    #: ``host:pid`` of the worker whose phase committed it ("" for the version its producer created
    #: and for an OBSERVING head, committed with the last result of its step's tool calls).
    worker: str = ""
    #: Claims of the phase at this version (above 1: an earlier delivery died).
    attempt: int = 1
    message_count: int = 0

    @classmethod
    def of(cls, head: RunHead) -> Checkpoint:
        ran = head.ran
        return cls(
            version=head.version,
            step=head.step,
            phase=head.phase,
            at=head.updated_at,
            worker=f"{ran.host}:{ran.pid}" if ran is not None else "",
            attempt=ran.attempt if ran is not None else 1,
            message_count=head.message_count,
        )


def checkpoint_of(heads: Sequence[RunHead], version: int) -> RunHead | None:
    """The committed head at ``version``, if the run has one."""
    return next((h for h in heads if h.version == version), None)


def fork_conversation(messages: Sequence[Message], input: str | None) -> list[Message]:
    """The conversation a fork starts thinking from (see the module doc)."""
    conversation = list(messages)
    if input is not None:
        last_user = max((i for i, m in enumerate(conversation) if isinstance(m, UserMessage)), default=-1)
        if last_user >= 0:
            conversation = [*conversation[:last_user], UserMessage(content=input)]
    while conversation and isinstance(conversation[-1], AssistantMessage):
        conversation.pop()
    return conversation


def forked_handoffs(origin: RunHead, replayed: int) -> list[HandoffRecord]:
    """The handoffs a fork of checkpoint ``origin`` keeps, when it replays the first ``replayed``
    messages of the original's conversation (see the module doc): those whose target's system
    prompt is among them. Each record's ``at`` is a position in that same stored list."""
    return [record for record in origin.handoffs if record.at < replayed]


def last_good_checkpoint(heads: Sequence[RunHead]) -> RunHead | None:
    """The checkpoint a fork "from the last good checkpoint" starts from: the last one committed
    before the run ended (its newest, for a run still going), None for a run with none.

    A run ends with the commit of its terminal phase (the failure, the interruption, the answer),
    so the checkpoint before it holds the run as it was just before the step that ended it: a
    fork from it (whose conversation drops a trailing assistant message, see the module doc) does
    that step again, from its think.
    """
    return next((head for head in reversed(heads) if not head.terminal), None)
