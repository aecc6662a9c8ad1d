"""Each adapter says when its provider cut an answer at the output token limit (``truncated``),
from that provider's own stop reason, whole answers and streams alike."""

from __future__ import annotations

import pytest

from shared.llm.react import ReActAdapter
from tests.fakeproviders import Reply
from tests.unit.llm.support import Harness, drain, request

#: Each provider's stop reason for an answer cut at its limit.
CUT = {"openai": "length", "anthropic": "max_tokens", "ollama": "length"}
#: And for an answer that ended by itself.
WHOLE = {"openai": "stop", "anthropic": "end_turn", "ollama": "stop"}


@pytest.mark.parametrize("provider", sorted(CUT))
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_cut_answer_is_truncated(harness: Harness, provider: str, stream: bool) -> None:
    _, adapter = harness.pair(
        provider, Reply(text="The three causes are, first, the", truncated=True), Reply(text="Done.")
    )
    for expected, text in ((True, "The three causes are, first, the"), (False, "Done.")):
        response = drain(adapter.stream(request()))[1] if stream else adapter.complete(request())
        assert response.text == text
        assert response.finish_reason == (CUT if expected else WHOLE)[provider]
        assert response.truncated is expected


def test_the_react_wrapper_keeps_the_cut(harness: Harness) -> None:
    _, inner = harness.pair("openai", Reply(text="Final Answer: the first of many", truncated=True))
    response = ReActAdapter(inner).complete(request())
    assert response.text == "the first of many" and response.truncated is True
