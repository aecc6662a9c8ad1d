"""The documented ``wesichain.start`` message is the one the workers accept."""

from __future__ import annotations

import json
import re
from pathlib import Path

from shared.request import StartMessage

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
