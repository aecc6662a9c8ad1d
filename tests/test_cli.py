"""The ``wesichain`` CLI against a real redis-server and real worker processes."""

from __future__ import annotations

import json
import re

import pytest

from producer.cli import main
from producer.client import Client
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL
from shared.state import Phase
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.invariants import ONE_HOP

AGENTS = "tests.agents_fixture"
UNREACHABLE = "redis://127.0.0.1:1/0"
EVENT_LINE = re.compile(r"^\[step (\d+)\] (\w+)\s")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() exports --redis/--agents to the environment (for worker children): restore it after.
    monkeypatch.delenv(ENV_PREFIX, raising=False)
    monkeypatch.setenv(ENV_REDIS_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(ENV_AGENTS, AGENTS)


def cli(redis_url: str, *args: str) -> int:
    return main([*args, "--redis", redis_url, "--agents", AGENTS])


def submit_json(redis_url: str, capsys: pytest.CaptureFixture[str], agent: str) -> str:
    assert cli(redis_url, "submit", agent, "go", "--json") == 0
    out = capsys.readouterr().out
    return str(json.loads(out)["run_id"])


# -- against real workers ---------------------------------------------------------------------------


@pytest.mark.integration
def test_submit_wait_json(
    workers: list[WorkerProcess], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(redis_server.url, "submit", "direct", "hi", "--wait", "--json") == 0
    captured = capsys.readouterr()
    *events, final = [json.loads(line) for line in captured.out.splitlines()]
    assert [e["kind"] for e in events if e["kind"] != "TokenDelta"] == [
        "RunStarted",
        "StepStarted",
        "ModelResponded",
        "Completed",
    ]
    assert final["phase"] == "completed"
    assert final["answer"] == "The answer is 42."
    assert final["input"] == "hi" and final["agent"] == "direct"
    assert {e["run_id"] for e in events} == {final["run_id"]}
    assert captured.err == ""


@pytest.mark.integration
def test_submit_wait_text_status_and_events(
    workers: list[WorkerProcess], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(redis_server.url, "submit", "one_hop", "add please", "--wait") == 0
    captured = capsys.readouterr()
    run_id = re.fullmatch(r"run ([0-9a-f]{32})\n", captured.err)[1]  # type: ignore[index]
    assert re.search(r"^answer\s+1 \+ 2 = 3$", captured.out, re.M)
    assert re.search(r"^phase\s+completed\s+step 2/10", captured.out, re.M)

    assert cli(redis_server.url, "status", run_id, "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["run_id"], status["phase"], status["answer"], status["step"]) == (
        run_id,
        "completed",
        "1 + 2 = 3",
        2,
    )

    assert cli(redis_server.url, "status", run_id) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"run      {run_id}"
    assert re.search(r"^agent\s+one_hop v1\s+model scripted:one_hop$", out, re.M)

    assert cli(redis_server.url, "events", run_id) == 0
    lines = capsys.readouterr().out.splitlines()
    printed = [m[2] for line in lines if (m := EVENT_LINE.match(line))]
    assert len(printed) == len(lines)
    kinds = [k for k in printed if k != "TokenDelta"]
    assert kinds == ONE_HOP
    assert "add ok 3.0" in next(line for line in lines if "ToolCompleted" in line)

    assert cli(redis_server.url, "events", run_id, "--json") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["kind"] for r in records if r["kind"] != "TokenDelta"] == kinds
    assert records[-1]["answer"] == "1 + 2 = 3"


@pytest.mark.integration
def test_submit_without_wait_prints_the_run_id(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(redis_server.url, "submit", "direct", "hi") == 0
    run_id = capsys.readouterr().out.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", run_id)
    assert client.handle(run_id).wait(30).phase is Phase.COMPLETED


@pytest.mark.integration
def test_cancel_a_long_tool_run(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = submit_json(redis_server.url, capsys, "long_tool")
    handle = client.handle(run_id)
    wait_until(lambda: handle.status().phase is Phase.ACTING, timeout=30, what="the run to reach ACTING")
    # Wait until the tool is really running, so the cancel interrupts it mid-call.
    wait_until(
        lambda: any(e.kind == "ToolDispatched" for e in handle.events(follow=False)),
        timeout=10,
        what="dispatch",
    )
    assert cli(redis_server.url, "cancel", run_id) == 0
    assert capsys.readouterr().out.strip() == "cancel requested (run was acting)"
    head = handle.wait(timeout=30)
    assert head.phase is Phase.INTERRUPTED
    assert head.answer is None
    events = list(handle.events(follow=False))
    assert events[-1].kind == "Interrupted"
    assert "Completed" not in {e.kind for e in events}

    assert cli(redis_server.url, "cancel", run_id) == 0
    assert capsys.readouterr().out.strip() == "run already interrupted"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("verb", "extra", "printed", "answer"),
    [
        ("approve", [], "approved; run {} resumes", "charged: "),
        (
            "deny",
            ["--note", "not today"],
            "denied; run {} resumes without the denied calls",
            "denied: Denied by a human reviewer: not today. The tool call was not executed.",
        ),
    ],
)
def test_approve_and_deny_a_parked_run(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    verb: str,
    extra: list[str],
    printed: str,
    answer: str,
) -> None:
    run_id = submit_json(redis_server.url, capsys, "needs_approval")
    handle = client.handle(run_id)
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, timeout=30, what="the run to park")
    assert cli(redis_server.url, verb, run_id, *extra) == 0
    assert capsys.readouterr().out.strip() == printed.format(run_id)
    head = handle.wait(timeout=30)
    assert head.phase is Phase.COMPLETED
    assert head.answer is not None and head.answer.startswith(answer)
    # The run has moved on: a second decision is refused with a clear message.
    assert cli(redis_server.url, verb, run_id) == 2
    assert capsys.readouterr().err.strip() == f"wesichain: run {run_id} is completed, not awaiting approval"


@pytest.mark.integration
def test_an_agent_no_worker_serves_is_refused_unless_queued_anyway(
    workers: list[WorkerProcess], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(redis_server.url, "submit", "no_such_agent", "hi", "--wait", "--json") == 2
    err = capsys.readouterr().err
    assert err.startswith("wesichain: no live worker serves agent 'no_such_agent' (agents served now: ")
    assert "one_hop" in err and "--no-check" in err
    # Queued anyway, the run reaches a worker, which fails it: exit 1.
    assert cli(redis_server.url, "submit", "no_such_agent", "hi", "--wait", "--json", "--no-check") == 1
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert final["phase"] == "failed"
    assert final["error"]["kind"] == "Config"
    assert "unknown agent 'no_such_agent'" in final["error"]["message"]


@pytest.mark.integration
def test_agents_and_workers_list_what_live_workers_serve(
    workers: list[WorkerProcess], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(redis_server.url, "agents", "--json") == 0
    agents = {a["name"]: a for a in json.loads(capsys.readouterr().out)}
    assert {"one_hop", "direct", "needs_approval"} <= set(agents)
    assert sorted(agents["one_hop"]["workers"]) == sorted(f"{w.name}@test" for w in workers)
    add = next(t for t in agents["one_hop"]["tools"] if t["name"] == "add")
    assert add["parameters"]["required"] == ["a", "b"] and add["retry_safe"] is True
    assert agents["needs_approval"]["approval_required"] == ["charge"]
    assert cli(redis_server.url, "workers", "--json") == 0
    listed = {w["id"]: w for w in json.loads(capsys.readouterr().out)}
    assert set(listed) >= {f"{w.name}@test" for w in workers}
    assert all(w["consuming"] for w in listed.values())
    assert cli(redis_server.url, "health", "--worker", f"{workers[0].name}@test") == 0
    assert cli(redis_server.url, "health", "--worker", "nobody@nowhere") == 1
    assert "nobody@nowhere is not live" in capsys.readouterr().out


@pytest.mark.integration
def test_wait_timeout_exits_3(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(redis_server.url, "submit", "slow_step", "hi", "--wait", "--timeout", "0.5") == 3
    captured = capsys.readouterr()
    run_id = captured.err.splitlines()[0].removeprefix("run ")
    assert re.search(rf"^wesichain: run {run_id} still \w+ after 0.5s$", captured.err, re.M)
    # The run goes on regardless, and `events --follow` follows it to its end.
    assert cli(redis_server.url, "events", run_id, "--follow", "--json") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[-1]["kind"] == "Completed"
    assert records[-1]["answer"] == "slow step done"
    assert client.handle(run_id).status().phase is Phase.COMPLETED


@pytest.mark.parametrize("command", ["status", "events", "approve", "deny", "cancel"])
def test_unknown_run_id(redis_server: RedisServer, capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert cli(redis_server.url, command, "no-such-run") == 1
    captured = capsys.readouterr()
    assert captured.err == "wesichain: no run 'no-such-run'\n"
    assert captured.out == ""


# -- configuration and connectivity errors ------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["status", "abc"], ["submit", "direct", "hi"], ["events", "abc"], ["cancel", "abc"]],
)
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://x", "Redis URL must start with redis://, rediss:// or memory://, got 'http://x'"),
        ("redis://", "Redis URL has no host: 'redis://'"),
    ],
)
def test_bad_redis_url(capsys: pytest.CaptureFixture[str], args: list[str], url: str, message: str) -> None:
    assert cli(url, *args) == 2
    captured = capsys.readouterr()
    assert captured.err == f"wesichain: configuration error: {message}\n"
    assert captured.out == ""


def test_bad_redis_url_password_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("http://user:s3cret@host/0", "status", "abc") == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "s3cret" not in err and "***" in err


@pytest.mark.parametrize(
    "args",
    [
        ["status", "abc"],
        ["submit", "direct", "hi"],
        ["events", "abc"],
        ["cancel", "abc"],
        ["submit", "direct", "hi", "--wait"],
    ],
)
def test_unreachable_redis(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert cli(UNREACHABLE, *args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"wesichain: cannot reach Redis at {UNREACHABLE}: ")
    assert "Connection refused" in captured.err
    assert "Traceback" not in captured.err
    assert len(captured.err.splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "message"), [("   ", "input is empty"), ("x" * 32_001, "input is 32001 chars")]
)
def test_bad_input(capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    assert cli(UNREACHABLE, "submit", "direct", text) == 2
    assert capsys.readouterr().err.startswith(f"wesichain: {message}")


def test_bad_model_string(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(UNREACHABLE, "submit", "direct", "hi", "--model", "no-provider") == 2
    assert capsys.readouterr().err == "wesichain: model must look like PROVIDER:MODEL, got 'no-provider'\n"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["submit"])
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: wesichain")
    assert "``" not in out and ":class:" not in out
    for command in ("demo", "worker", "sweeper", "submit", "events", "agents", "workers", "health"):
        assert command in out


@pytest.mark.integration
def test_events_resume_after_a_stream_id(
    workers: list[WorkerProcess],
    redis_server: RedisServer,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    handle = client.submit("one_hop", "go")
    handle.wait(30)
    assert cli(redis_server.url, "events", handle.run_id, "--json") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ids = [r["stream_id"] for r in records]
    assert all(ids) and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    # Resume after the third event: exactly the rest, in order, nothing repeated.
    assert cli(redis_server.url, "events", handle.run_id, "--json", "--after", ids[2]) == 0
    rest = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["stream_id"] for r in rest] == ids[3:]
    # The Python client gives the same ids, so a follower can resume where it stopped.
    assert [e.stream_id for e in handle.events(follow=False, after=ids[2])] == ids[3:]


@pytest.mark.integration
def test_wait_says_when_no_worker_consumes_the_queue(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from producer import commands

    monkeypatch.setattr(commands, "QUIET_S", 0.5)
    server = RedisServer().start()  # its own: no worker of the suite consumes from it
    try:
        assert cli(server.url, "submit", "direct", "hi", "--wait", "--timeout", "3", "--no-check") == 3
    finally:
        server.cleanup()
    err = capsys.readouterr().err.splitlines()
    run_id = err[0].removeprefix("run ")
    assert err[1:] == [
        f"wesichain: run {run_id} is idle, and no live worker consumes queue wesichain.model:"
        " it waits until one does",
        f"wesichain: run {run_id} still idle after 3s",
    ]
