"""Real provider adapters through the whole distributed runtime.

Real ``wesichain worker`` processes run agents whose models are ``openai:…``, ``ollama:…``,
``anthropic:…`` and ``react+openai:…``; their environment points the adapters at loopback fake
servers (``tests/fakeproviders.py``) running in this test process, which script the answers and
faults and record every request, so the tests can assert the exact wire format the workers sent.
The module has its own redis-server and workers, so it never shares queues with other tests.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from producer.client import Client, RunHandle
from shared.events import Event
from shared.llm.base import Usage
from shared.protocol import RUNNING, attempts_field
from shared.state import Phase, RunHead
from tests.agents_fixture import EFFECTS_KEY
from tests.agents_providers import PROVIDERS, Forecast
from tests.broker import Settings
from tests.chaos.support import pending_task_ids
from tests.fakeproviders import FakeProvider, FakeToolCall, Fault, RecordedRequest, Reply, Split
from tests.harness import RedisServer, WorkerProcess, running, wait_until

TIMEOUT = 30
OPENAI_KEY = "sk-test-SECRET-1234567890"
ANTHROPIC_KEY = "sk-ant-test-SECRET-0987654321"
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY)
AGENTS_MODULE = "tests.agents_providers"
#: The fakes send a text answer in pieces of this many characters (one stream event each).
TEXT_PIECE = 4


# --- Fakes shared by the module -----------------------------------------------------------------


class _Paced(list[bytes]):
    """Body pieces written over ``total_s`` seconds instead of all at once."""

    def __init__(self, pieces: list[bytes], total_s: float) -> None:
        super().__init__(pieces)
        self.total_s = total_s

    def __iter__(self) -> Iterator[bytes]:
        gap = self.total_s / max(1, len(self))
        start = time.monotonic()
        for number, piece in enumerate(list.__iter__(self)):
            delay = start + number * gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            yield piece


class Fake(FakeProvider):
    """One provider's fake for the whole module, re-scripted by each test.

    No default reply: a request beyond the script gets a 409, which fails the run loudly.
    ``pace_s`` spreads each answer's body over that many seconds (a slow stream).
    """

    def __init__(self, provider: str) -> None:
        super().__init__(provider, default=None)
        self.pace_s = 0.0

    def script(self, *replies: Reply) -> int:
        """Replaces the scripted replies; returns a mark for :meth:`since`."""
        with self._changed:
            self._replies.clear()
            self._replies.extend(replies)
            return len(self._requests)

    def since(self, mark: int) -> list[RecordedRequest]:
        return self.requests[mark:]

    @property
    def unused(self) -> int:
        with self._changed:
            return len(self._replies)

    def split(self, payload: bytes, *, inside_characters: bool = False) -> list[bytes]:
        pieces = super().split(payload, inside_characters=inside_characters)
        return _Paced(pieces, self.pace_s) if self.pace_s > 0 else pieces


@dataclass
class Cluster:
    server: RedisServer
    workers: list[WorkerProcess]
    client: Client
    fakes: dict[str, Fake]

    def run(
        self, agent: str, text: str = "what is 2 + 3?", **kwargs: Any
    ) -> tuple[RunHandle, RunHead, list[Event]]:
        handle = self.client.submit(agent, text, **kwargs)
        events = list(handle.events(idle_timeout=TIMEOUT))
        return handle, handle.wait(TIMEOUT), events


def _need_redis() -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed; .ci/run installs it")
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _need_redis()
    fakes = {provider: Fake(provider) for provider in PROVIDERS}
    for fake in fakes.values():
        fake.start()
    server = RedisServer().start()
    env = {
        **fakes["openai"].env(OPENAI_KEY),
        **fakes["anthropic"].env(ANTHROPIC_KEY),
        **fakes["ollama"].env(),
    }
    log_dir = str(tmp_path_factory.mktemp("provider-workers"))
    workers = [
        WorkerProcess(f"pw{i}", server.url, agents=AGENTS_MODULE, concurrency=2, env=env, log_dir=log_dir)
        for i in (1, 2)
    ]
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS_MODULE))
    try:
        with running(workers):
            yield Cluster(server, workers, client, fakes)
    finally:
        client.close()
        server.cleanup()
        for fake in fakes.values():
            fake.stop()


@pytest.fixture(autouse=True)
def _fresh_fakes(cluster: Cluster) -> Iterator[None]:
    for fake in cluster.fakes.values():
        fake.script()
        fake.pace_s = 0.0
    yield
    for fake in cluster.fakes.values():
        fake.pace_s = 0.0


# --- Helpers --------------------------------------------------------------------------------------


def of(events: list[Event], kind: str) -> list[Any]:
    return [e for e in events if e.kind == kind]


def decisions(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.decision, e.error.kind) for e in of(events, "StepFailed")]


def tokens(events: list[Event]) -> str:
    return "".join(e.text for e in of(events, "TokenDelta"))


def text_pieces(text: str) -> int:
    return math.ceil(len(text) / TEXT_PIECE)


def add_call(provider: str, a: object = 2, b: object = 3) -> FakeToolCall:
    """A tool call asking for ``add``; OpenAI and Anthropic calls carry ids, Ollama's do not."""
    ids = {"openai": "call_Rt7Qz2", "anthropic": "toolu_01RoundTrip", "ollama": None}
    return FakeToolCall("add", {"a": a, "b": b}, id=ids[provider])


def expected_call_id(provider: str) -> str:
    return add_call(provider).id or "call_0"  # Ollama sends no ids: the adapter numbers calls


# --- 1. A whole run with a tool round trip, per provider ------------------------------------------


def _check_openai_wire(first: RecordedRequest, second: RecordedRequest, call_id: str, stream: bool) -> None:
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert first.body["model"] == "fake-model"
    assert first.body.get("stream", False) is stream
    assert [t["function"]["name"] for t in first.body["tools"]] == ["add"]
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    (call,) = messages[2]["tool_calls"]
    assert call["id"] == call_id and call["type"] == "function" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert messages[3] == {"role": "tool", "tool_call_id": call_id, "content": "5.0"}


def _check_ollama_wire(first: RecordedRequest, second: RecordedRequest, call_id: str, stream: bool) -> None:
    assert first.path == "/api/chat"
    assert "authorization" not in first.headers
    assert first.body["model"] == "fake-model:latest"  # only the first colon separates the provider
    assert first.body["stream"] is stream
    assert [t["function"]["name"] for t in first.body["tools"]] == ["add"]
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    (call,) = messages[2]["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}  # an object, not text
    assert messages[3] == {"role": "tool", "content": "5.0", "tool_name": "add"}


def _check_anthropic_wire(
    first: RecordedRequest, second: RecordedRequest, call_id: str, stream: bool
) -> None:
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == ANTHROPIC_KEY
    assert first.headers["anthropic-version"] == "2023-06-01"
    assert first.body["model"] == "fake-model" and first.body["max_tokens"] > 0
    assert first.body.get("stream", False) is stream
    assert first.body["system"].startswith("provider test agent anthropic_")
    assert [t["name"] for t in first.body["tools"]] == ["add"]
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    (tool_use,) = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert tool_use["id"] == call_id and tool_use["name"] == "add" and tool_use["input"] == {"a": 2, "b": 3}
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": call_id, "content": "5.0", "is_error": False}
    ]


WIRE_CHECKS = {"openai": _check_openai_wire, "ollama": _check_ollama_wire, "anthropic": _check_anthropic_wire}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_tool_round_trip_through_workers(cluster: Cluster, provider: str, stream: bool) -> None:
    fake = cluster.fakes[provider]
    mark = fake.script(
        Reply(tool_calls=[add_call(provider)], input_tokens=101, output_tokens=11),
        Reply(text="2 + 3 = 5", input_tokens=202, output_tokens=22),
    )
    handle, head, events = cluster.run(f"{provider}_{'stream' if stream else 'complete'}")

    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "2 + 3 = 5"
    call_id = expected_call_id(provider)
    (dispatched,) = of(events, "ToolDispatched")
    assert dispatched.call_id == call_id and dispatched.tool == "add"
    assert dispatched.arguments == {"a": 2, "b": 3}
    (done,) = of(events, "ToolCompleted")
    assert done.ok and done.output == "5.0" and done.call_id == call_id
    assert cluster.client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:{call_id}") == "1"

    # Usage: each model answer's tokens, as the provider reported them, and their sum on the run.
    responded = [(e.step, e.tool_calls, e.usage) for e in of(events, "ModelResponded")]
    assert responded == [
        (1, 1, Usage(input_tokens=101, output_tokens=11)),
        (2, 0, Usage(input_tokens=202, output_tokens=22)),
    ]
    assert head.usage == Usage(input_tokens=303, output_tokens=33)
    assert events[-1].kind == "Completed" and events[-1].usage == head.usage
    assert tokens(events) == ("2 + 3 = 5" if stream else "")

    requests = fake.since(mark)
    assert len(requests) == 2, [r.body for r in requests]
    WIRE_CHECKS[provider](requests[0], requests[1], call_id, stream)
    # Every phase ran in a worker process, not here.
    worker_pids = set().union(*(w.pids() for w in cluster.workers))
    assert {e.worker.pid for e in events} <= worker_pids


@pytest.mark.parametrize("provider", PROVIDERS)
def test_structured_output_uses_the_providers_schema_mode(cluster: Cluster, provider: str) -> None:
    """OpenAI gets ``response_format``, Ollama ``format``; Anthropic, which has no such mode, is told
    the schema in its system prompt. A first answer that does not fit is reprompted."""
    fake = cluster.fakes[provider]
    mark = fake.script(Reply(text='{"city": "Lyon"}'), Reply(text='{"city": "Lyon", "celsius": 21.5}'))
    _, head, events = cluster.run(f"{provider}_structured", "weather in Lyon?")
    assert head.phase is Phase.COMPLETED, head.error
    assert head.output == {"city": "Lyon", "celsius": 21.5}
    assert decisions(events) == [("reprompt", "InvalidModelAction")]
    first, second = fake.since(mark)
    schema = Forecast.model_json_schema()
    if provider == "openai":
        assert first.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "Forecast", "schema": schema, "strict": False},
        }
    elif provider == "ollama":
        assert first.body["format"] == schema
    else:
        assert "response_format" not in first.body and "format" not in first.body
        assert json.dumps(schema, sort_keys=True) in first.body["system"]
    correction = second.body["messages"][-1]["content"]
    assert "celsius: Field required" in str(correction)


def test_run_model_override_picks_the_provider(cluster: Cluster) -> None:
    openai, anthropic = cluster.fakes["openai"], cluster.fakes["anthropic"]
    openai_mark = openai.script()
    anthropic_mark = anthropic.script(Reply(text="answered by the override"))
    _, head, events = cluster.run("openai_stream", model="anthropic:fake-model")
    assert head.phase is Phase.COMPLETED and head.answer == "answered by the override"
    assert head.model == "anthropic:fake-model"
    assert of(events, "RunStarted")[0].model == "anthropic:fake-model"
    assert openai.since(openai_mark) == []
    (request,) = anthropic.since(anthropic_mark)
    assert request.body["model"] == "fake-model"


def test_model_the_workers_cannot_build_fails_the_run_at_once(cluster: Cluster) -> None:
    handle, head, events = cluster.run("openai_stream", model="nope:fake-model")
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "Config" and head.error.step == 1
    assert "unknown model provider 'nope'" in head.error.message
    # Failed by the first think, not after crashing it until a lease expired and a takeover.
    store = cluster.client.store
    assert head.epoch == 0, "the run waited for lease expiries instead of failing"
    # One claim of the think (at version 2, after the start), and no other.
    assert store.attempts(handle.run_id) == {attempts_field(2, RUNNING): "1", attempts_field(1, RUNNING): "1"}
    assert of(events, "Failed")[0].error == head.error


NOTE = "Zürich, 東京 🌍 und 😀"
UNICODE_ANSWER = "Notiert: Zürich, 東京 🌍 und 😀 — 12°C 🌧."


@pytest.mark.parametrize("split", list(Split))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_characters_cut_on_the_wire_arrive_whole(cluster: Cluster, provider: str, split: Split) -> None:
    # BYTES: every multi-byte character is cut between HTTP chunks. UTF16: every emoji's two
    # halves arrive as \u escapes in separate stream events (text and tool call arguments).
    fake = cluster.fakes[provider]
    ids = {"openai": "call_note", "anthropic": "toolu_note", "ollama": None}
    call_id = ids[provider] or "call_0"
    calls = [FakeToolCall("note", {"text": NOTE}, id=ids[provider])]
    mark = fake.script(
        Reply(text="Ich notiere 🌍.", tool_calls=calls, split_characters=split),
        Reply(text=UNICODE_ANSWER, split_characters=split),
    )
    handle, head, events = cluster.run(f"{provider}_notes", "Note this down, please.")

    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == UNICODE_ANSWER
    assert tokens(events) == "Ich notiere 🌍." + UNICODE_ANSWER
    assert [e.text for e in of(events, "ModelResponded")] == ["Ich notiere 🌍.", UNICODE_ANSWER]
    (dispatched,) = of(events, "ToolDispatched")
    assert (dispatched.call_id, dispatched.arguments) == (call_id, {"text": NOTE})
    (done,) = of(events, "ToolCompleted")
    assert done.ok and done.output == NOTE
    messages = cluster.client.store.load_messages(handle.run_id)
    assert [m.content for m in messages if m.role == "assistant"] == ["Ich notiere 🌍.", UNICODE_ANSWER]
    assert decisions(events) == []
    assert len(fake.since(mark)) == 2


# --- 2. Live tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_live_tokens_reach_a_follower_in_batches(cluster: Cluster, provider: str) -> None:
    fake = cluster.fakes[provider]
    answer = "Streamed live: " + " ".join(f"token{i:02d}" for i in range(24))
    fake.script(Reply(text=answer))
    fake.pace_s = 0.8  # the answer trickles in, in pieces of a few bytes, for 0.8 s

    handle = cluster.client.submit(f"{provider}_stream", "stream, please")
    # This process follows; a worker streams.
    events: list[Event] = list(handle.events(idle_timeout=TIMEOUT))
    head = handle.wait(TIMEOUT)

    assert head.phase is Phase.COMPLETED and head.answer == answer
    deltas = of(events, "TokenDelta")
    assert tokens(events) == answer
    # Tokens were written to the run's stream while the model was still answering: all of them
    # before the commit of the answer, the first one before the provider had finished sending.
    kinds = [e.kind for e in events]
    assert kinds.index("ModelResponded") > max(i for i, k in enumerate(kinds) if k == "TokenDelta")
    (responded,) = of(events, "ModelResponded")
    assert deltas[0].ts < deltas[-1].ts <= responded.ts
    # ...and in batches: fewer TokenDelta writes than the provider's text chunks.
    assert 2 <= len(deltas) < text_pieces(answer), (len(deltas), text_pieces(answer))
    assert {e.worker.pid for e in deltas} <= set().union(*(w.pids() for w in cluster.workers))
    assert os.getpid() not in {e.worker.pid for e in deltas}


# --- 3. Faults through the whole runtime ----------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limit_with_retry_after_then_success(cluster: Cluster, provider: str) -> None:
    fake = cluster.fakes[provider]
    mark = fake.script(Reply(fault=Fault.RATE_LIMIT, retry_after="1"), Reply(text="after the rate limit"))
    _, head, events = cluster.run(f"{provider}_stream")
    assert head.phase is Phase.COMPLETED and head.answer == "after the rate limit"
    first, second = fake.since(mark)
    assert second.at - first.at >= 0.95, "the worker did not wait the Retry-After"
    assert decisions(events) == []  # retried inside the model call: the run never saw a failure


def test_retry_after_above_the_cap_is_left_to_the_policy(cluster: Cluster) -> None:
    fake = cluster.fakes["openai"]
    mark = fake.script(Reply(fault=Fault.RATE_LIMIT, retry_after="600"), Reply(text="on the next think"))
    _, head, events = cluster.run("openai_stream")
    assert head.phase is Phase.COMPLETED and head.answer == "on the next think"
    first, second = fake.since(mark)
    # The policy's backoff (about a second), nowhere near the 600 s the provider asked for.
    assert second.at - first.at < 60, "a worker thread was parked for the Retry-After"
    (failed,) = of(events, "StepFailed")
    assert failed.decision == "retry" and failed.error.kind == "ModelTransport"
    assert "retry after 600s" in failed.error.message and failed.error.details["status_code"] == 429


@pytest.mark.parametrize("provider", PROVIDERS)
def test_persistent_server_errors_fail_after_bounded_retries(cluster: Cluster, provider: str) -> None:
    fake = cluster.fakes[provider]
    # The agent's policy is Retry(n=1): two thinks, each making three HTTP attempts.
    mark = fake.script(*[Reply(fault=Fault.SERVER_ERROR)] * 6)
    _, head, events = cluster.run(f"{provider}_retry_once")
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert head.error.details["status_code"] == 500 and head.error.details["retryable"] is True
    assert "gave up after 3 attempts" in head.error.message
    assert head.error.message.startswith(f"{provider}: ")
    assert decisions(events) == [("retry", "ModelTransport"), ("fail", "ModelTransport")]
    assert of(events, "ModelResponded") == [] and head.answer is None
    assert len(fake.since(mark)) == 6 and fake.unused == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_bad_request_fails_without_retry(cluster: Cluster, provider: str) -> None:
    fake = cluster.fakes[provider]
    mark = fake.script(Reply(fault=Fault.BAD_REQUEST), Reply(text="must never be asked for"))
    _, head, events = cluster.run(f"{provider}_stream")  # the default policy would retry twice
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert head.error.details["status_code"] == 400 and head.error.details["retryable"] is False
    assert "HTTP 400" in head.error.message
    assert decisions(events) == [("fail", "ModelTransport")]
    # Every task the run left in the broker has been delivered: none of them asked again.
    wait_until(lambda: not pending_task_ids(cluster.client.store.redis), TIMEOUT, what="the broker to drain")
    assert len(fake.since(mark)) == 1 and fake.unused == 1


PARTIAL = "PARTIAL answer, cut short, never to be accepted"
FINAL = "the whole answer"


@pytest.mark.parametrize("fault", [Fault.NO_TERMINATOR, Fault.DROP], ids=["no-terminator", "dropped"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_cut_stream_is_retried_never_accepted(cluster: Cluster, provider: str, fault: Fault) -> None:
    fake = cluster.fakes[provider]
    mark = fake.script(Reply(text=PARTIAL, fault=fault), Reply(text=FINAL))
    handle, head, events = cluster.run(f"{provider}_stream")
    assert head.phase is Phase.COMPLETED and head.answer == FINAL
    ((decision, kind),) = decisions(events)
    assert (decision, kind) == ("retry", "ModelTransport")
    assert of(events, "StepFailed")[0].error.details["retryable"] is True
    assert [e.text for e in of(events, "ModelResponded")] == [FINAL]
    assert of(events, "Completed")[0].answer == FINAL
    stored = [m.content for m in cluster.client.store.load_messages(handle.run_id) if m.role == "assistant"]
    assert stored == [FINAL]
    assert len(fake.since(mark)) == 2


def test_stream_cut_every_time_fails_without_an_answer(cluster: Cluster) -> None:
    fake = cluster.fakes["anthropic"]
    mark = fake.script(Reply(text=PARTIAL, fault=Fault.DROP), Reply(text=PARTIAL, fault=Fault.NO_TERMINATOR))
    handle, head, events = cluster.run("anthropic_retry_once")
    assert head.phase is Phase.FAILED and head.answer is None
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert "without message_stop" in head.error.message
    assert decisions(events) == [("retry", "ModelTransport"), ("fail", "ModelTransport")]
    assert of(events, "ModelResponded") == [] and of(events, "Completed") == []
    assert [m.role for m in cluster.client.store.load_messages(handle.run_id)] == ["system", "user"]
    assert len(fake.since(mark)) == 2


def _openai_body(arguments: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """A whole Chat Completions answer whose tool call arguments are exactly ``arguments``."""
    call = {"id": "call_broken", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {
        "id": "chatcmpl-broken",
        "object": "chat.completion",
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens},
    }


MALFORMED = {
    # (agent, the model's malformed call, what the error says)
    "openai": (
        "openai_complete",
        Reply(body=_openai_body('{"a": 2, "b": ', 5, 5)),
        "are not valid JSON",
    ),
    "anthropic": (
        "anthropic_stream",
        Reply(tool_calls=[add_call("anthropic", a="two")]),
        "failed validation",
    ),
    "ollama": (
        "ollama_stream",
        Reply(tool_calls=[FakeToolCall("add", [2, 3])]),  # type: ignore[arg-type]
        "must be a JSON object",
    ),
}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_malformed_tool_arguments_fail_by_policy(cluster: Cluster, provider: str) -> None:
    agent, reply, fragment = MALFORMED[provider]
    fake = cluster.fakes[provider]
    mark = fake.script(reply, Reply(text="must never be asked for"))
    _, head, events = cluster.run(agent)  # the default policy: on_invalid_action=Fail()
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidModelAction"
    assert fragment in head.error.message and head.error.tool == "add" and head.error.step == 1
    assert head.error.details.get("args") is not None and head.error.details.get("raw")
    assert decisions(events) == [("fail", "InvalidModelAction")]
    assert of(events, "ToolDispatched") == []
    assert len(fake.since(mark)) == 1


def test_malformed_tool_arguments_reprompt_by_policy(cluster: Cluster) -> None:
    fake = cluster.fakes["openai"]
    mark = fake.script(
        Reply(body=_openai_body('{"a": 2, "b": ', 50, 5)),
        Reply(tool_calls=[add_call("openai")], input_tokens=60, output_tokens=6),
        Reply(text="2 + 3 = 5", input_tokens=70, output_tokens=7),
    )
    _, head, events = cluster.run("openai_reprompt")  # on_invalid_action=Reprompt(n=1)
    assert head.phase is Phase.COMPLETED and head.answer == "2 + 3 = 5"
    assert head.reprompts == 1
    (failed,) = of(events, "StepFailed")
    assert failed.decision == "reprompt" and failed.error.kind == "InvalidModelAction"
    assert "are not valid JSON" in failed.error.message
    assert head.usage == Usage(input_tokens=180, output_tokens=18)
    _, retried, _ = fake.since(mark)
    correction = retried.body["messages"][-1]
    assert correction["role"] == "user" and "could not be used" in correction["content"]
    assert "are not valid JSON" in correction["content"]


# --- 4. Secrets -----------------------------------------------------------------------------------


def _base64_forms(secret: str) -> list[str]:
    """The secret's base64 text at each of the three byte alignments it can have in a longer value."""
    raw = secret.encode()
    forms = []
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw).decode()
        first = math.ceil(pad / 3) * 3  # the first 3-byte group wholly inside the secret
        last = (pad + len(raw)) // 3 * 3
        forms.append(encoded[first // 3 * 4 : last // 3 * 4])
    return forms


LEAK_FORMS = [form for secret in SECRETS for form in (secret, *_base64_forms(secret))]


def leaks(text: str) -> list[str]:
    return [form for form in LEAK_FORMS if form in text]


def _envelopes(value: Any) -> Iterator[dict[str, Any]]:
    """Kombu message envelopes (a dict with ``body`` and ``properties``) anywhere in a JSON value."""
    if isinstance(value, dict):
        if "body" in value and isinstance(value.get("properties"), dict):
            yield value
        for item in value.values():
            yield from _envelopes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _envelopes(item)


@dataclass
class Inspection:
    """Every text found, with the Celery messages inside decoded: kombu base64-encodes bodies."""

    texts: int = 0
    leaked: list[tuple[str, str]] = field(default_factory=list)
    #: (where, task name) of every Celery task message decoded.
    tasks: list[tuple[str, str]] = field(default_factory=list)

    def check(self, where: str, text: str) -> None:
        self.texts += 1
        for found in leaks(text):
            self.leaked.append((where, found))
        try:
            value = json.loads(text)
        except ValueError:
            return
        for envelope in _envelopes(value):
            body = envelope["body"]
            if envelope["properties"].get("body_encoding") == "base64" and isinstance(body, str):
                decoded = base64.b64decode(body).decode("utf-8", "replace")
                self.check(f"{where} (decoded body)", decoded)
            task = (envelope.get("headers") or {}).get("task")
            if task:
                self.tasks.append((where, task))


def scan_redis(r: redis.Redis, inspection: Inspection) -> None:
    """Every key and every value in the database, whatever its type."""
    for key in r.scan_iter(count=1000):
        name = _text(key)
        inspection.check(f"key {name}", name)
        values: list[Any]
        try:
            kind = _text(r.type(key))
            if kind == "string":
                values = [r.get(key)]
            elif kind == "hash":
                values = [item for pair in r.hgetall(key).items() for item in pair]
            elif kind == "list":
                values = r.lrange(key, 0, -1)
            elif kind == "set":
                values = list(r.smembers(key))
            elif kind == "zset":
                values = r.zrange(key, 0, -1)
            elif kind == "stream":
                entries: list[Any] = r.xrange(key) or []
                values = [item for _, entry in entries for pair in entry.items() for item in pair]
            else:
                values = []
        except redis.ResponseError:  # the key changed type or vanished between two commands
            continue
        for value in values:
            if value is not None:
                inspection.check(name, _text(value))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisWatch:
    """Watches everything reaching Redis while runs go on.

    A MONITOR connection sees every command any client sends (task publishes, Lua scripts and
    the commands they run, pub/sub events), and a scanner reads every key's value every few
    milliseconds (queued and unacked task messages included).
    """

    STOP = "provider-tests-stop-watching"

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.monitored = Inspection()
        self.scanned = Inspection()
        self.scans = 0
        self.unacked_seen: set[str] = set()
        self._stop = threading.Event()
        self._monitor_ready = threading.Event()
        self._threads = [
            threading.Thread(target=self._monitor, daemon=True),
            threading.Thread(target=self._scan, daemon=True),
        ]

    def __enter__(self) -> RedisWatch:
        for thread in self._threads:
            thread.start()
        assert self._monitor_ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        r = redis.Redis(host="127.0.0.1", port=self.server.port)
        r.echo(self.STOP)
        r.close()
        for thread in self._threads:
            thread.join(10)

    def _monitor(self) -> None:
        r = redis.Redis(host="127.0.0.1", port=self.server.port)
        with r.monitor() as monitor:
            self._monitor_ready.set()
            while True:
                line = monitor.connection.read_response()
                text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
                if self.STOP in text:
                    break
                for arg in _monitor_args(text):
                    self.monitored.check("MONITOR", arg)
        r.close()

    def _scan(self) -> None:
        r = redis.Redis(host="127.0.0.1", port=self.server.port)
        while not self._stop.is_set():
            before = len(self.scanned.tasks)
            scan_redis(r, self.scanned)
            self.scans += 1
            self.unacked_seen.update(t for where, t in self.scanned.tasks[before:] if "unacked" in where)
            time.sleep(0.01)
        r.close()


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b"}


def _monitor_args(line: str) -> list[str]:
    """The arguments of one MONITOR line, unescaped (Redis quotes them and escapes bytes)."""

    def unescape(match: re.Match[str]) -> str:
        code = match.group(1)
        if len(code) == 3 and code[0] in "xX":
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, code)

    return [
        _ESCAPE.sub(unescape, arg).encode("latin-1", "replace").decode("utf-8", "replace")
        for arg in _QUOTED.findall(line)
    ]


def _assert_redacted_401(head: RunHead, events: list[Event], provider: str) -> None:
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert head.error.details["status_code"] == 401 and head.error.details["retryable"] is False
    assert "[redacted]" in head.error.message, head.error.message
    assert "[redacted]" in head.error.details["body"]
    assert decisions(events) == [("fail", "ModelTransport")]
    assert head.error.message.startswith(f"{provider}: ")


@pytest.mark.redis_broker  # watches the task messages on their way through the Redis broker
def test_api_keys_never_leave_the_worker(cluster: Cluster) -> None:
    openai, anthropic = cluster.fakes["openai"], cluster.fakes["anthropic"]
    with RedisWatch(cluster.server) as watch:
        for provider, fake in (("openai", openai), ("anthropic", anthropic)):
            # A slow stream keeps the think task in flight (unacked) while the scanner reads it.
            fake.pace_s = 0.4
            mark = fake.script(Reply(tool_calls=[add_call(provider)]), Reply(text="2 + 3 = 5"))
            _, head, _ = cluster.run(f"{provider}_stream")
            assert head.phase is Phase.COMPLETED, head.error
            fake.pace_s = 0.0
            # The key was really in use: the provider got it on every call.
            key = OPENAI_KEY if provider == "openai" else ANTHROPIC_KEY
            assert all(key in " ".join(r.headers.values()) for r in fake.since(mark))

            # The provider echoes the key in its 401 error body; the run records it redacted.
            fake.script(Reply(fault=Fault.UNAUTHORIZED))
            _, head, events = cluster.run(f"{provider}_stream")
            _assert_redacted_401(head, events, provider)
    final = Inspection()
    r = redis.Redis(host="127.0.0.1", port=cluster.server.port)
    scan_redis(r, final)
    r.close()

    assert watch.monitored.leaked == [] and watch.scanned.leaked == [] and final.leaked == []
    # The watch really saw the runs: every kind of task message, decoded, and some while unacked.
    sent = {task for _, task in watch.monitored.tasks}
    assert {"wesichain.start", "wesichain.think", "wesichain.tool", "wesichain.observe"} <= sent
    assert "wesichain.think" in watch.unacked_seen
    assert watch.scans >= 3 and final.texts > 50
    for worker in cluster.workers:
        log = worker.log()
        assert "wesichain.think" in log
        assert leaks(log) == [], f"worker {worker.name} logged a key"


# --- 5. ReAct over a text-only model --------------------------------------------------------------


@pytest.mark.parametrize("agent", ["react", "react_complete"])
def test_react_text_protocol_drives_a_tool_call(cluster: Cluster, agent: str) -> None:
    fake = cluster.fakes["openai"]
    mark = fake.script(
        Reply(
            text='Thought: I should add them.\nAction: add\nAction Input: {"a": 2, "b": 3}',
            input_tokens=31,
            output_tokens=13,
        ),
        Reply(
            text="Thought: I now know the final answer\nFinal Answer: 2 + 3 = 5",
            input_tokens=41,
            output_tokens=14,
        ),
    )
    handle, head, events = cluster.run(agent)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "2 + 3 = 5"
    (dispatched,) = of(events, "ToolDispatched")
    assert dispatched.tool == "add" and dispatched.arguments == {"a": 2, "b": 3}
    (done,) = of(events, "ToolCompleted")
    assert done.ok and done.output == "5.0"
    assert head.usage == Usage(input_tokens=72, output_tokens=27)
    # Only the final answer is streamed as tokens, never the Action text.
    assert tokens(events) == ("2 + 3 = 5" if agent == "react" else "")

    first, second = fake.since(mark)
    assert "tools" not in first.body and "tools" not in second.body  # no native tool calling
    system = first.body["messages"][0]
    assert system["role"] == "system" and "Action Input:" in system["content"]
    assert "- add: Add two numbers" in system["content"]
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "Action: add" in messages[2]["content"]
    assert messages[3]["content"] == "Observation: 5.0"
    assert cluster.client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:react_0") == "1"
