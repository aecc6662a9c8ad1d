"""Model strings to adapters in a worker: a bounded cache that closes what it evicts, the
operator's settings, and scripted model files only where a run may name them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import shared.llm.resolver as resolver
from shared.agents import Agent, AgentRegistry
from shared.errors import ConfigError, ModelTransport
from shared.llm import scripted
from shared.llm.base import LlmAdapter
from shared.llm.openai import OpenAIAdapter
from shared.llm.react import ReActAdapter
from shared.llm.resolver import CACHE, CACHE_SIZE, AdapterCache, resolve_model
from shared.llm.scripted import ScriptedModel, reply
from shared.llm.settings import HttpSettings, LlmSettings
from shared.llm.transport import shared_ssl_context
from tests.fakeproviders import Fault, Reply
from tests.unit.llm.support import API_KEY, Harness, MockProvider, drain, request

SETTINGS = LlmSettings()
REPLIES = [{"text": "from the file"}]


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    for name in ("OPENAI_BASE_URL", "WESICHAIN_SCRIPTS_DIR", "WESICHAIN_LLM_READ_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    yield
    CACHE.clear()


def closed(adapter: LlmAdapter) -> bool:
    inner = adapter.inner if isinstance(adapter, ReActAdapter) else adapter
    assert isinstance(inner, OpenAIAdapter)
    return inner.closed


# --- The cache ----------------------------------------------------------------------------------


def test_cache_stays_bounded_and_closes_the_adapters_it_evicts() -> None:
    cache = AdapterCache(size=4)
    registry = AgentRegistry()

    def resolve(model: str) -> LlmAdapter:
        return resolve_model(model, registry, settings=SETTINGS, cache=cache)

    adapters = [resolve(f"openai:model-{i}") for i in range(10)]
    assert len(cache) == 4
    assert [closed(a) for a in adapters] == [True] * 6 + [False] * 4
    assert resolve("openai:model-6") is adapters[6]  # a hit: now the most recently used
    rebuilt = resolve("openai:model-0")  # evicted before: built again, evicting model-7
    assert rebuilt is not adapters[0] and not closed(rebuilt)
    assert [closed(a) for a in adapters[6:]] == [False, True, False, False]
    cache.clear()
    assert len(cache) == 0 and closed(rebuilt) and closed(adapters[6])


def test_process_cache_holds_at_most_32_adapters_however_many_model_strings_runs_name() -> None:
    registry = AgentRegistry()
    adapters = [resolve_model(f"openai:distinct-{i}", registry, settings=SETTINGS) for i in range(200)]
    assert CACHE_SIZE == 32 and len(CACHE) == 32
    assert sum(closed(a) for a in adapters) == 200 - 32
    assert not any(closed(a) for a in adapters[-32:])


def test_an_evicted_react_adapter_closes_its_inner_adapter() -> None:
    cache = AdapterCache(size=1)
    registry = AgentRegistry()
    react = resolve_model("react+openai:m", registry, settings=SETTINGS, cache=cache)
    assert isinstance(react, ReActAdapter) and not closed(react)
    resolve_model("openai:other", registry, settings=SETTINGS, cache=cache)
    assert closed(react)


def test_threads_resolving_at_once_share_one_adapter_and_the_bound_holds() -> None:
    cache = AdapterCache(size=8)
    registry = AgentRegistry()
    start = threading.Barrier(16)
    results: list[list[LlmAdapter]] = [[] for _ in range(16)]

    def work(worker: int) -> None:
        start.wait()
        for i in range(40):
            # Every thread asks for the same string first, then strings of its own.
            results[worker].append(resolve_model("openai:shared", registry, settings=SETTINGS, cache=cache))
            results[worker].append(
                resolve_model(f"openai:{worker}-{i}", registry, settings=SETTINGS, cache=cache)
            )

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    firsts = {id(result[0]) for result in results}
    assert len(firsts) == 1  # built once, under the lock, not once per thread
    distinct = {id(a): a for result in results for a in result}.values()
    assert len(cache) == 8
    assert sum(not closed(a) for a in distinct) == 8  # exactly the cached ones are open
    cache.clear()


def test_adapters_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # Building a TLS context (the parsed CA bundle) per client was most of an adapter's cost.
    built: list[object] = []
    real = httpx.create_ssl_context

    def counting() -> object:
        built.append(None)
        return real()

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    shared_ssl_context.cache_clear()
    try:
        for i in range(5):
            resolve_model(f"openai:tls-{i}", AgentRegistry(), settings=SETTINGS)
        assert len(built) == 1
    finally:
        shared_ssl_context.cache_clear()


def test_an_adapter_retired_during_a_call_finishes_it_then_closes() -> None:
    mock = MockProvider("openai", Reply(text="streamed while retired"), Reply(text="served after"))
    adapter = mock.adapter()
    try:
        parts = adapter.stream(request())
        first = next(parts)  # the call is under way
        adapter.retire()
        assert not adapter.closed
        deltas, final = drain([first, *parts])
        assert "".join(deltas) == final.text == "streamed while retired"
        assert adapter.closed
        # Whoever obtained it before it was evicted may still use it: on a pool of its own.
        assert adapter.complete(request()).text == "served after"
        assert adapter.closed
    finally:
        adapter.close()


# --- Settings -----------------------------------------------------------------------------------


def test_adapters_are_built_with_the_settings() -> None:
    settings = LlmSettings(read_timeout_s=42.0, connect_timeout_s=3.0, max_attempts=2, retry_after_cap_s=7.0)
    adapter = resolve_model("openai:m", AgentRegistry(), settings=settings)
    assert isinstance(adapter, OpenAIAdapter)
    assert adapter.settings == HttpSettings(
        read_timeout_s=42.0, connect_timeout_s=3.0, max_attempts=2, retry_after_cap_s=7.0
    )
    # Other settings, another adapter: nothing built with the old ones is reused.
    assert resolve_model("openai:m", AgentRegistry(), settings=SETTINGS) is not adapter


def test_the_read_timeout_of_the_environment_bounds_a_call(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = harness.fake("openai", Reply(fault=Fault.STALL))
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("WESICHAIN_LLM_READ_TIMEOUT_S", "0.3")
    monkeypatch.setenv("WESICHAIN_LLM_MAX_ATTEMPTS", "1")
    adapter = resolve_model("openai:m", AgentRegistry())  # as the worker calls it
    with pytest.raises(ModelTransport, match="read timeout") as info:
        adapter.complete(request())  # the request sets no timeout of its own
    assert info.value.retryable is True
    assert len(fake.requests) == 1


def test_a_bad_setting_fails_resolution_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_LLM_READ_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="WESICHAIN_LLM_READ_TIMEOUT_S='soon' is not valid"):
        resolve_model("openai:m", AgentRegistry())


def test_malformed_model_string() -> None:
    with pytest.raises(ConfigError, match="must look like PROVIDER:MODEL"):
        resolve_model("gpt-4o", AgentRegistry(), settings=SETTINGS)


# --- Scripted models ----------------------------------------------------------------------------


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "scripts" / "replies.json"
    path.parent.mkdir()
    path.write_text(json.dumps(REPLIES))
    return path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every scripted model file the resolver reads."""
    seen: list[str] = []
    real = scripted.load_script  # what the resolver calls (it imports it), patched there below

    def recording(path: str) -> list[object]:
        seen.append(path)
        return list(real(path))

    monkeypatch.setattr(resolver, "load_script", recording)
    return seen


def answer(adapter: LlmAdapter) -> str | None:
    return adapter.complete(request()).text


def test_registered_scripted_model_is_used_as_registered() -> None:
    registry = AgentRegistry()
    model = ScriptedModel([reply("registered")])
    registry.add_model("demo", model)
    cache = AdapterCache()
    assert resolve_model("scripted:demo", registry, settings=SETTINGS, cache=cache) is model
    assert len(cache) == 0  # never cached, never closed by the resolver


def test_unregistered_name_that_is_no_file() -> None:
    with pytest.raises(ConfigError, match="neither registered in the agents module nor a .json file"):
        resolve_model("scripted:demo", AgentRegistry(), settings=SETTINGS)


def test_a_file_named_by_a_run_is_not_read(script: Path, reads: list[str]) -> None:
    # It exists and is valid: a producer must still not make the worker read it.
    with pytest.raises(ConfigError) as info:
        resolve_model(f"scripted:{script}", AgentRegistry(), settings=SETTINGS)
    assert reads == []
    assert str(info.value) == (
        f"scripted model file {str(script)!r} was not read: a run may name a model file only as "
        "its agent's own model. Register the model in the agents module (registry.add_model) and "
        "name it scripted:NAME, or set WESICHAIN_SCRIPTS_DIR on the workers to the directory runs "
        "may read model files from"
    )


def test_the_agents_own_file_is_read(script: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(script.parent)
    adapter = resolve_model("scripted:replies.json", AgentRegistry(), trusted=True, settings=SETTINGS)
    assert answer(adapter) == "from the file"
    assert reads == ["replies.json"]  # as written, relative to the working directory


def test_a_file_written_in_the_agents_module_is_trusted_whoever_names_it(
    script: Path, reads: list[str]
) -> None:
    registry = AgentRegistry()
    registry.add(Agent(name="scripted_agent", model=f"scripted:{script}", system_prompt="s"))
    adapter = resolve_model(f"scripted:{script}", registry, settings=SETTINGS)
    assert answer(adapter) == "from the file"
    assert reads == [str(script)]


@pytest.mark.parametrize("name", ["replies.json", "./sub/../replies.json", "{dir}/replies.json"])
def test_a_file_inside_the_scripts_dir_is_read(
    script: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("WESICHAIN_SCRIPTS_DIR", str(script.parent))
    adapter = resolve_model(f"scripted:{name.format(dir=script.parent)}", AgentRegistry())
    assert answer(adapter) == "from the file"
    assert reads == [str(script.resolve())]


@pytest.mark.parametrize(
    "name", ["../outside.json", "{tmp}/outside.json", "link.json", "sub/../../outside.json"]
)
def test_a_file_resolving_outside_the_scripts_dir_is_not_read(
    script: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    outside = script.parent.parent / "outside.json"
    outside.write_text(json.dumps(REPLIES))
    (script.parent / "link.json").symlink_to(outside)  # a symlink inside, pointing out
    monkeypatch.setenv("WESICHAIN_SCRIPTS_DIR", str(script.parent))
    with pytest.raises(ConfigError, match="was not read: it is outside WESICHAIN_SCRIPTS_DIR"):
        resolve_model(f"scripted:{name.format(tmp=script.parent.parent)}", AgentRegistry())
    assert reads == []


def test_a_symlink_inside_the_scripts_dir_to_a_file_inside_is_read(
    script: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (script.parent / "alias.json").symlink_to(script)
    monkeypatch.setenv("WESICHAIN_SCRIPTS_DIR", str(script.parent))
    assert answer(resolve_model("scripted:alias.json", AgentRegistry())) == "from the file"
    assert reads == [str(script.resolve())]
