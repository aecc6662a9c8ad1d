"""The documented ``wesichain.start`` message is the one the workers accept."""

from __future__ import annotations

import json
import re
from pathlib import Path

from shared.request import RunRequest, StartMessage, new_run, validate_request
from shared.settings import Limits
from shared.state import Phase

DOC = Path(__file__).resolve().parents[2] / "docs" / "start-message.md"


def test_the_documented_schema_is_the_code_s() -> None:
    text = DOC.read_text()
    match = re.search(r"<!-- start-message-schema -->\n```json\n(.*?)\n```", text, re.S)
    assert match is not None, "docs/start-message.md lost its schema block"
    assert json.loads(match.group(1)) == StartMessage.model_json_schema()


def test_the_documented_example_is_a_valid_message() -> None:
    text = DOC.read_text()
    example = re.search(r"kwargs=(\{\n.*?\n    \}),\n", text, re.S)
    assert example is not None
    kwargs = {
        "run_id": "order-4711-refund",
        "create": {"agent": "support", "input": "Refund order 4711, it arrived broken."},
    }
    assert '"run_id": "order-4711-refund"' in example.group(1)
    message = StartMessage.model_validate(kwargs)
    assert message.create.agent == "support" and (message.version, message.epoch) == (1, 0)


def test_a_new_run_holds_every_field_of_its_request() -> None:
    """The one function that turns a request into a run (client, API, bare start message) drops
    nothing: each field of ``RunRequest``, set to something other than its default, is on the run."""
    request = validate_request(
        {
            "agent": "support",
            "input": "Refund order 4711",
            "thread_id": "t-1",
            "thread_policy": "reject",
            "metadata": {"order": 4711},
            "model": "openai:gpt-4o-mini",
            "tenant": "acme",
            "callback": {"task": "billing.on_agent_done", "queue": "billing"},
            "state": {"count": 1},
            "namespace": "nightly",
            "assistant": "refunds",
            "assistant_version": 3,
        },
        Limits(),
    )
    assert all(getattr(request, name) != field.default for name, field in RunRequest.model_fields.items())
    head = new_run("r-1", request)
    assert (head.run_id, head.phase, head.version, head.link) == ("r-1", Phase.IDLE, 1, None)
    for name in RunRequest.model_fields:
        assert getattr(head, name) == getattr(request, name), name
