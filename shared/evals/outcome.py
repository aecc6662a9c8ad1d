"""What scorers read about one case run, and the result row an eval keeps for it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import AssistantMessage, Message, ToolMessage

__all__ = ["MAX_TRAJECTORY", "MAX_TEXT", "CaseResult", "RunOutcome", "Score", "Step", "trajectory"]

#: Trajectory entries kept per case, and characters per text in them: a result stays small.
MAX_TRAJECTORY = 60
MAX_TEXT = 2000


def _cut(text: str | None, limit: int = MAX_TEXT) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"


class Step(BaseModel):
    """One entry of a run's trajectory: a thought (the model's text), a tool call, or its result."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "thought" | "call" | "result"
    text: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    is_error: bool = False


class RunOutcome(BaseModel):
    """How a case run ended, as scorers see it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    #: ``completed``, ``failed`` or ``interrupted``.
    status: str
    answer: str | None = None
    error: dict[str, Any] | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    trajectory: list[Step] = Field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def tool_calls(self) -> list[Step]:
        return [s for s in self.trajectory if s.kind == "call"]


class Score(BaseModel):
    """One scorer's verdict on one case run: a value in [0, 1] and why."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float = Field(ge=0, le=1)
    passed: bool
    explanation: str = ""
    #: The scorer itself failed (raised, or could not be loaded): the value is 0.
    error: bool = False
    #: A judge's model and the tokens its call took (none for the other scorers).
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


class CaseResult(BaseModel):
    """The row an eval keeps per case run (case x variant x repeat)."""

    item: str
    variant: str
    case_id: str
    repeat: int
    run_id: str
    status: str
    passed: bool
    answer: str | None = None
    error: dict[str, Any] | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: US dollars of the run and of its judges' calls.
    cost_usd: float = 0.0
    #: Tokens the judges' calls took (the run's own are ``input_tokens`` and ``output_tokens``).
    judge_tokens: int = 0
    latency_s: float = 0.0
    scores: list[Score] = Field(default_factory=list)
    trajectory: list[Step] = Field(default_factory=list)
    scored_at: float = 0.0

    @property
    def failed(self) -> bool:
        """The run itself did not complete (as opposed to completing with a wrong answer)."""
        return self.status != "completed"

    @property
    def error_kind(self) -> str | None:
        if self.error is not None:
            return str(self.error.get("kind") or "error")
        if any(s.error for s in self.scores):
            return "ScorerError"
        return None


def trajectory(messages: list[Message]) -> list[Step]:
    """Thoughts, tool calls and results of a run's conversation, bounded."""
    steps: list[Step] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            if message.content:
                steps.append(Step(kind="thought", text=_cut(message.content)))
            for call in message.tool_calls:
                steps.append(Step(kind="call", tool=call.name, arguments=call.arguments))
        elif isinstance(message, ToolMessage):
            steps.append(
                Step(kind="result", tool=message.name, text=_cut(message.content), is_error=message.is_error)
            )
    if len(steps) > MAX_TRAJECTORY:
        half = MAX_TRAJECTORY // 2
        steps = [
            *steps[:half],
            Step(kind="thought", text=f"… {len(steps) - MAX_TRAJECTORY} more …"),
            *steps[-half:],
        ]
    return steps
