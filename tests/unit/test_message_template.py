"""A message written into its kind's template is the JSON ``json.dumps`` makes of the message
with those fields set, whatever the fields hold."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from producer.publishing import MessageTemplate
from shared.state import TaskSpec

HEADERS: dict[str, Any] = {
    "lang": "py",
    "task": "wesichain.think",
    "id": "a",
    "shadow": None,
    "eta": None,
    "retries": 0,
}
HEADERS |= {"timelimit": [None, 30.5], "root_id": "r", "parent_id": None, "argsrepr": "()"}
HEADERS |= {"kwargsrepr": "{}", "origin": "gen1@hóst", "ignore_result": False, "stamps": {}}
PROPERTIES: dict[str, Any] = {"correlation_id": "a", "reply_to": "x", "delivery_mode": 2, "priority": 0}
PROPERTIES |= {"delivery_info": {"exchange": "", "routing_key": "wesichain.model"}}
PROPERTIES |= {"body_encoding": "base64", "delivery_tag": "t"}
MESSAGE: dict[str, Any] = {"body": "W10=", "content-encoding": "utf-8", "content-type": "application/json"}
MESSAGE |= {"headers": HEADERS, "properties": PROPERTIES}


@pytest.mark.parametrize(
    ("run_id", "root_id", "parent_id"),
    [("plain", None, None), ("r'é\"\\\n\x00\u2028", "root\x7f", "pär"), ("x", "", "p")],
)
def test_a_filled_template_is_the_message_dumped_whole(
    run_id: str, root_id: str | None, parent_id: str | None
) -> None:
    template = MessageTemplate.of([("lpush", ("wesichain.model", json.dumps(MESSAGE)))])
    assert template is not None
    spec = TaskSpec(name="wesichain.think", task_id="t-1", arguments={"run_id": run_id, "step": 2})
    name, (key, text) = template.fill(spec, "()", f"{{'run_id': {run_id!r}}}", root_id, parent_id, "reply")
    message = json.loads(text)
    assert (name, key) == ("lpush", "wesichain.model")
    assert text == json.dumps(message)  # the bytes json.dumps writes, key order included
    assert list(message) == list(MESSAGE) and list(message["headers"]) == list(HEADERS)
    assert list(message["properties"]) == list(PROPERTIES)
    headers, properties = message["headers"], message["properties"]
    assert (headers["id"], headers["root_id"], headers["parent_id"]) == ("t-1", root_id or "t-1", parent_id)
    assert headers["kwargsrepr"] == f"{{'run_id': {run_id!r}}}" and headers["origin"] == "gen1@hóst"
    assert (properties["correlation_id"], properties["reply_to"]) == ("t-1", "reply")
    assert properties["delivery_tag"] != "t"
    body = json.loads(base64.b64decode(message["body"]))
    assert body[:2] == [[], {"run_id": run_id, "step": 2}]
