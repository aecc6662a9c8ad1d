"""The ReAct text protocol: prompt rendering, reply parsing, and the wrapper over a real adapter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart, TextDelta, Usage
from shared.llm.react import ParsedReply, ReActAdapter, parse_reply, render_messages
from shared.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from tests.fakeproviders import Reply
from tests.unit.llm.support import WEATHER, Harness, drain, request


class Recording:
    """An in-process LlmAdapter that answers with fixed text and keeps the requests it got."""

    def __init__(self, *texts: str, pieces: int = 3) -> None:
        self.texts = list(texts)
        self.pieces = pieces
        self.requests: list[ModelRequest] = []

    def _answer(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(
            text=self.texts.pop(0), usage=Usage(input_tokens=3, output_tokens=2), finish_reason="stop"
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self._answer(request)

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        answer = self._answer(request)
        text = answer.text or ""
        for i in range(0, len(text), self.pieces):
            yield TextDelta(text=text[i : i + self.pieces])
        yield answer


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'Thought: I need the weather.\nAction: get_weather\nAction Input: {"city": "Zürich"}',
            ParsedReply(
                thought="I need the weather.", action="get_weather", action_input='{"city": "Zürich"}'
            ),
        ),
        (
            # Chatter after the JSON and an invented observation are not part of the input.
            'Action: `get_weather`\nAction Input: {"city": "Bern"} (Bern is in Switzerland)\n'
            "Observation: 9°C\nFinal Answer: 9°C",
            ParsedReply(thought=None, action="get_weather", action_input='{"city": "Bern"}'),
        ),
        (
            'Action: [get_weather]\nAction Input:\n```json\n{"city": "Oslo"}\n```',
            ParsedReply(thought=None, action="get_weather", action_input='{"city": "Oslo"}'),
        ),
        (
            "Thought: I know this.\nFinal Answer: It is 12°C.\nHave a nice day.",
            ParsedReply(thought="I know this.", answer="It is 12°C.\nHave a nice day."),
        ),
        ("Just a plain answer.", ParsedReply(thought=None, answer="Just a plain answer.")),
        (
            # An action without input is still an action: the runtime reports the bad input.
            "Thought: hmm\nAction: get_weather",
            ParsedReply(thought="hmm", action="get_weather", action_input=""),
        ),
        (
            "Action: get_weather\nAction Input: city is Zürich",
            ParsedReply(thought=None, action="get_weather", action_input="city is Zürich"),
        ),
        (
            'Action: get_weather\nAction Input: {"city": "Zür',
            ParsedReply(thought=None, action="get_weather", action_input='{"city": "Zür'),
        ),
        (
            "Final Answer: use the Action: keyword wisely",
            ParsedReply(thought=None, answer="use the Action: keyword wisely"),
        ),
    ],
)
def test_parse_reply(text: str, expected: ParsedReply) -> None:
    assert parse_reply(text) == expected


# --- rendering --------------------------------------------------------------------------------


def test_renders_tools_format_and_history_as_text() -> None:
    messages = render_messages(
        [
            SystemMessage(content="You are a weather bot."),
            UserMessage(content="Weather in Zürich and Bern?"),
            AssistantMessage(
                content="Thought: two cities.",
                tool_calls=[
                    ToolCall(id="react_0", name="get_weather", arguments={"city": "Zürich"}),
                    ToolCall(id="react_1", name="get_weather", arguments={"city": "Bern"}),
                ],
            ),
            ToolMessage(tool_call_id="react_0", name="get_weather", content="12°C"),
            ToolMessage(tool_call_id="react_1", name="get_weather", content="station down", is_error=True),
            AssistantMessage(content="Both are mild."),
        ],
        [WEATHER],
    )
    system, user, assistant, observation, final = messages
    assert isinstance(system, SystemMessage)
    assert system.content.startswith("You are a weather bot.\n\n")
    assert "- get_weather: Current weather for a city" in system.content
    assert '"required": ["city"]' in system.content
    assert "Action: the tool to use, one of [get_weather]" in system.content
    assert "Final Answer:" in system.content
    assert user == UserMessage(content="Weather in Zürich and Bern?")
    assert assistant == AssistantMessage(
        content='Thought: two cities.\nAction: get_weather\nAction Input: {"city": "Zürich"}\n'
        'Action: get_weather\nAction Input: {"city": "Bern"}'
    )
    assert observation == UserMessage(content="Observation: 12°C\nObservation (error): station down")
    assert final == AssistantMessage(content="Final Answer: Both are mild.")


def test_adds_a_system_prompt_when_there_is_none() -> None:
    (system, user) = render_messages([UserMessage(content="hi")], [])
    assert isinstance(system, SystemMessage)
    assert "no tools" in system.content
    assert user == UserMessage(content="hi")


# --- the adapter ------------------------------------------------------------------------------


def test_action_becomes_a_tool_call_and_no_native_tools_are_sent() -> None:
    inner = Recording('Thought: look it up\nAction: get_weather\nAction Input: {"city": "Zürich"}')
    adapter = ReActAdapter(inner)
    history = AssistantMessage(
        tool_calls=[ToolCall(id="react_0", name="get_weather", arguments={"city": "Bern"})]
    )
    response = adapter.complete(
        request(
            UserMessage(content="q"),
            history,
            ToolMessage(tool_call_id="react_0", name="get_weather", content="9°C"),
            tools=[WEATHER],
        )
    )
    # One call so far in the conversation, so this one is react_1: ids stay unique per run.
    assert response.tool_calls == [
        RawToolCall(id="react_1", name="get_weather", arguments='{"city": "Zürich"}')
    ]
    assert response.text == "look it up"
    assert response.usage == Usage(input_tokens=3, output_tokens=2)
    assert response.raw is not None and response.raw.startswith("Thought: look it up")
    (sent,) = inner.requests
    assert sent.tools == []
    assert "get_weather" in (sent.messages[0].content or "")


def test_final_answer_and_plain_text() -> None:
    adapter = ReActAdapter(Recording("Thought: easy\nFinal Answer: 42", "forty-two"))
    first = adapter.complete(request())
    assert (first.text, first.tool_calls) == ("42", [])
    second = adapter.complete(request())
    assert (second.text, second.tool_calls) == ("forty-two", [])


def test_malformed_action_input_is_passed_raw() -> None:
    adapter = ReActAdapter(Recording("Action: get_weather\nAction Input: the city of Zürich"))
    (call,) = adapter.complete(request(tools=[WEATHER])).tool_calls
    assert call == RawToolCall(id="react_0", name="get_weather", arguments="the city of Zürich")


def test_constructor_tools_override_request_tools() -> None:
    inner = Recording("Final Answer: ok")
    ReActAdapter(inner, tools=[WEATHER]).complete(request())
    assert "get_weather" in (inner.requests[0].messages[0].content or "")


def test_stream_forwards_only_the_final_answer() -> None:
    adapter = ReActAdapter(Recording("Thought: I know.\nFinal Answer:   It is 12°C in Zürich.", pieces=2))
    deltas, final = drain(adapter.stream(request()))
    assert "".join(deltas) == "It is 12°C in Zürich."
    assert final.text == "It is 12°C in Zürich."


def test_stream_forwards_nothing_for_an_action() -> None:
    adapter = ReActAdapter(
        Recording('Final thoughts\nAction: get_weather\nAction Input: {"city": "Bern"}', pieces=1)
    )
    deltas, final = drain(adapter.stream(request(tools=[WEATHER])))
    assert deltas == []
    assert final.tool_calls == [RawToolCall(id="react_0", name="get_weather", arguments='{"city": "Bern"}')]


def test_stream_of_plain_text_is_passed_on_whole() -> None:
    deltas, final = drain(ReActAdapter(Recording("no markers here")).stream(request()))
    assert deltas == ["no markers here"]
    assert final.text == "no markers here"


def test_over_a_real_provider(harness: Harness) -> None:
    fake = harness.fake(
        "ollama",
        Reply(text='Thought: need data\nAction: get_weather\nAction Input: {"city": "東京"}'),
        Reply(text="Final Answer: 18°C in 東京"),
    )
    adapter = ReActAdapter(harness.adapter(fake))
    first = adapter.complete(request(UserMessage(content="Tokyo?"), tools=[WEATHER]))
    assert first.tool_calls == [RawToolCall(id="react_0", name="get_weather", arguments='{"city": "東京"}')]
    call = first.tool_calls[0]
    followup = request(
        UserMessage(content="Tokyo?"),
        AssistantMessage(
            content=first.text,
            tool_calls=[ToolCall(id="react_0", name=call.name, arguments={"city": "東京"})],
        ),
        ToolMessage(tool_call_id="react_0", name="get_weather", content="18°C"),
        tools=[WEATHER],
    )
    deltas, final = drain(adapter.stream(followup))
    assert final.text == "18°C in 東京"
    assert "".join(deltas) == "18°C in 東京"
    first_sent, second_sent = fake.requests
    assert "tools" not in first_sent.body and "tools" not in second_sent.body
    assert [m["role"] for m in second_sent.body["messages"]] == ["system", "user", "assistant", "user"]
    assert second_sent.body["messages"][2]["content"] == (
        'need data\nAction: get_weather\nAction Input: {"city": "東京"}'
    )
    assert second_sent.body["messages"][3]["content"] == "Observation: 18°C"
