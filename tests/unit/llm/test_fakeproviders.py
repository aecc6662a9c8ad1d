"""The fake servers themselves: awkward chunking really happens, scripts and records work, and
the subprocess mode serves a script and shuts down cleanly."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from shared.llm.base import RawToolCall
from shared.llm.openai import OpenAIAdapter
from tests.fakeproviders import FakeProvider, Reply, Split
from tests.unit.llm.support import API_KEY, FAST, Harness, drain, request

ROOT = Path(__file__).resolve().parents[3]


def test_stream_arrives_in_tiny_chunks_that_split_characters(harness: Harness) -> None:
    fake = harness.fake("openai", Reply(text="🌍" * 40))
    with httpx.Client() as client:
        with client.stream("POST", fake.url + "/v1/chat/completions", json={"stream": True}) as response:
            chunks = list(response.iter_raw())
    assert max(len(c) for c in chunks) <= 7
    assert len(chunks) > 100
    split_inside_a_character = 0
    for chunk in chunks:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            split_inside_a_character += 1
    assert split_inside_a_character > 0


def test_split_bytes_cuts_every_multi_byte_character(harness: Harness) -> None:
    fake = harness.fake("anthropic", Reply(text="ü東🌍" * 5, split_characters=Split.BYTES))
    with httpx.Client() as client:
        with client.stream("POST", fake.url + "/v1/messages", json={"stream": True}) as response:
            chunks = list(response.iter_raw())
    body = b"".join(chunks)
    text = body.decode("utf-8")
    assert (text.count("ü"), text.count("東"), text.count("🌍")) == (5, 5, 5)
    multi_byte = sum(1 for byte in body if byte >= 0xC0)
    assert multi_byte == 15
    # Each character's first byte ends a chunk: no chunk holds a whole multi-byte character.
    assert sum(1 for chunk in chunks if chunk[-1] >= 0xC0) == multi_byte


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama"])
def test_split_utf16_sends_the_halves_of_a_character_in_separate_events(
    harness: Harness, provider: str
) -> None:
    fake = harness.fake(provider, Reply(text="ab🌍cd😀", split_characters=Split.UTF16))
    path = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}[provider]
    with httpx.Client() as client:
        body = client.post(fake.url + path, json={"stream": True}).content
    assert body.isascii()  # every non-ASCII character is an escape
    lines = body.decode().splitlines()
    for high, low in (("\\ud83c", "\\udf0d"), ("\\ud83d", "\\ude00")):  # 🌍 and 😀
        (first,) = [number for number, line in enumerate(lines) if high in line]
        (second,) = [number for number, line in enumerate(lines) if low in line]
        assert first < second


def test_exhausted_script_is_a_loud_409(harness: Harness) -> None:
    fake = harness.fake("anthropic")
    with httpx.Client() as client:
        response = client.post(fake.url + "/v1/messages", json={"model": "m"})
    assert response.status_code == 409
    assert "no scripted reply" in response.json()["error"]["message"]


def test_default_reply_and_control_endpoints(harness: Harness) -> None:
    fake = harness.fake("ollama", default=Reply(text="default"))
    with httpx.Client(base_url=fake.url) as client:
        assert client.get("/_fake/health").json() == {"ok": True, "provider": "ollama"}
        client.post("/_fake/replies", json=[{"text": "queued"}])
        assert client.post("/api/chat", json={"stream": False}).json()["message"]["content"] == "queued"
        assert client.post("/api/chat", json={"stream": False}).json()["message"]["content"] == "default"
        recorded = client.get("/_fake/requests").json()
    assert [r["body"] for r in recorded] == [{"stream": False}, {"stream": False}]
    assert fake.wait_for_requests(2, timeout_s=1) == fake.requests


def test_wait_for_requests_has_a_deadline(harness: Harness) -> None:
    fake = harness.fake("openai")
    with pytest.raises(TimeoutError, match="0 of 1 requests"):
        fake.wait_for_requests(1, timeout_s=0.05)


def test_env_points_clients_at_the_fake(harness: Harness) -> None:
    openai = harness.fake("openai")
    assert openai.env(API_KEY) == {"OPENAI_BASE_URL": openai.url + "/v1", "OPENAI_API_KEY": API_KEY}
    ollama = harness.fake("ollama")
    assert ollama.env() == {"OLLAMA_HOST": ollama.url}


def read_first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise TimeoutError(f"no output within {timeout_s}s")
    return process.stdout.readline().strip()


def test_runs_as_a_subprocess(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "replies": [
                    {"fault": "server_error"},
                    {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "call_x"}]},
                ],
                "default": {"text": "Grüße"},
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "tests.fakeproviders",
        "--provider",
        "openai",
        "--port",
        "0",
        "--script",
        str(script),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            base_url = read_first_line(process, timeout_s=15)
            assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
            with OpenAIAdapter("gpt-4o", api_key=API_KEY, base_url=base_url, settings=FAST) as adapter:
                first = adapter.complete(request())
                _, second = drain(adapter.stream(request()))
            assert first.tool_calls == [RawToolCall(id="call_x", name="add", arguments='{"a": 1, "b": 2}')]
            assert second.text == "Grüße"
            with httpx.Client() as client:
                recorded = client.get(base_url.removesuffix("/v1") + "/_fake/requests").json()
            assert len(recorded) == 3  # the 500 was retried
            assert all(r["headers"]["authorization"] == f"Bearer {API_KEY}" for r in recorded)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr


def test_stop_ends_a_stalled_answer_at_once() -> None:
    from tests.fakeproviders import Fault

    fake = FakeProvider("openai", [Reply(fault=Fault.STALL)], stall_s=60).start()
    with httpx.Client() as client:
        started = time.monotonic()
        try:
            with pytest.raises(httpx.ReadTimeout):
                client.post(fake.url + "/v1/chat/completions", json={}, timeout=0.1)
        finally:
            fake.stop()
        assert time.monotonic() - started < 5
