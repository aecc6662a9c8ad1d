"""The Lua scripts spell no protocol of their own, and take what their specs say.

Every field name, state and format a script keeps in Redis comes from the prelude that
:mod:`shared.protocol` generates; a quoted literal in a ``.lua`` file must be one of Redis's own
words (:data:`REDIS_WORDS`), a number or flag in Redis's string form (:data:`VALUES`), or one of
the script's own replies and argument modes (its ``ScriptSpec.words`` in :mod:`shared.scripts`).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import redis

from shared import protocol
from shared.protocol import _definitions
from shared.scripts import (
    SPECS,
    ScriptCallError,
    ScriptNameError,
    _find_scripts,
    register_script,
    script_files,
    script_source,
)
from tests.harness import RedisServer

#: Redis's commands and their option keywords: they name no data of ours.
REDIS_WORDS = frozenset(
    {
        "DEL",
        "EXISTS",
        "EXPIRE",
        "GET",
        "HDEL",
        "HEXISTS",
        "HGETALL",
        "HGET",
        "HINCRBY",
        "HLEN",
        "HMGET",
        "HSET",
        "HSETNX",
        "HVALS",
        "LLEN",
        "LPOP",
        "LPOS",
        "LRANGE",
        "LREM",
        "PERSIST",
        "PEXPIRE",
        "PTTL",
        "RPUSH",
        "SADD",
        "SET",
        "SREM",
        "TIME",
        "XADD",
        "XRANGE",
        "ZADD",
        "ZCARD",
        "ZRANGE",
        "ZRANGEBYLEX",
        "ZRANGEBYSCORE",
        "ZREM",
        "ZREMRANGEBYSCORE",
        "ZSCORE",
        # Options: XADD's bound, ZADD's update conditions, SET's expiry and condition, ZRANGE's
        # scores and limit.
        "MAXLEN",
        "LT",
        "XX",
        "PX",
        "NX",
        "WITHSCORES",
        "LIMIT",
        # Arguments in Redis's syntax: an approximate MAXLEN, a stream id Redis picks, an unbounded
        # and an exclusive score range bound, a stream's last id.
        "~",
        "*",
        "-inf",
        "(",
        "+",
    }
)

#: The empty string (no value: an absent field, an empty list) and the numbers 0 and 1, as Redis
#: returns and stores integers and flags (a counter reset, OUTBOX_CLAIMED, CANCEL): values, not
#: names, so one spelled in a script means the same wherever it is read.
VALUES = frozenset({"", "0", "1"})

_TOKEN = re.compile(r"""--[^\n]*|'((?:[^'\\\n]|\\.)*)'|"((?:[^"\\\n]|\\.)*)"|\[=*\[""")


def lua_files() -> dict[str, Path]:
    """Every Lua file of the package, by script name."""
    root = Path(str(resources.files("shared")))
    files = {p.stem: p for p in sorted(root.rglob("*.lua"))}
    assert len(files) == len(list(root.rglob("*.lua"))), "two Lua files share a name"
    return files


def literals(source: str) -> Iterator[tuple[int, str]]:
    """The quoted string literals of a Lua source (comments skipped), with their line numbers."""
    for m in _TOKEN.finditer(source):
        text = m.group(0)
        if text.startswith("--"):
            continue
        line = source.count("\n", 0, m.start()) + 1
        if text.startswith("["):
            # A long string: nothing here spells one, and the scan would have to learn to read it.
            yield line, text
            continue
        yield line, m.group(1) if m.group(1) is not None else m.group(2)


def stray_literals(name: str, source: str) -> list[str]:
    """The literals of script ``name`` that are neither Redis's words, values, nor its own words."""
    allowed = REDIS_WORDS | VALUES | SPECS[name].words
    return [f"{name}.lua:{line}: {text!r}" for line, text in literals(source) if text not in allowed]


def test_every_lua_file_has_a_spec_and_every_spec_a_file() -> None:
    assert set(lua_files()) == set(SPECS)


def test_no_script_spells_a_name_state_or_format_of_its_own() -> None:
    stray = [s for name, path in lua_files().items() for s in stray_literals(name, path.read_text())]
    assert not stray, "use (or add) the prelude's name for these (shared/protocol.py):\n" + "\n".join(stray)


@pytest.mark.parametrize(
    "planted",
    [
        "redis.call('HSET', run, F_CALLBACK, 'pending')",
        'redis.call("HGET", attempts_key, "err:v" .. version .. ":" .. field)',
        "local lost = redis.call('HGET', attempts_key, 'lost:v' .. version)",
        "redis.call('HSET', KEYS[1], 'status', ARGV[2])",
    ],
)
def test_a_planted_literal_is_found(planted: str) -> None:
    body = lua_files()["commit"].read_text()
    assert stray_literals("commit", body) == []
    planted_body = body.replace("local now = now_ms()\n", f"local now = now_ms()\n{planted}\n", 1)
    assert stray_literals("commit", planted_body)


def test_comments_are_not_read_and_a_word_is_allowed_only_in_its_own_script() -> None:
    assert stray_literals("due", "-- 'pending' is fine in a comment\nreturn 1") == []
    assert stray_literals("inspect", "return {'moved'}") == []
    assert stray_literals("due", "return {'moved'}") == ["due.lua:1: 'moved'"]
    assert stray_literals("due", "return [[pending]]") == ["due.lua:1: '[['"]


def test_no_script_word_is_a_state_or_format_kept_in_redis() -> None:
    # A script's own word that equals a state or format of the protocol would let it spell that
    # one: ask for the prelude's name instead. (A reply may share a field's spelling, 'created'.)
    kept = {
        protocol.CALLBACK_PENDING,
        protocol.CALLBACK_DELIVERED,
        protocol.CALLBACK_GAVE_UP,
        protocol.EMPTY_OUTBOX,
        protocol.EVENT_FIELD,
        protocol.PIPE_EVENT_FIELD,
        protocol.PIPE_RUNNING,
        protocol.EVAL_RUNNING,
        protocol.EVAL_COMPLETED,
        protocol.EVAL_BUDGET_EXHAUSTED,
        protocol.ATTEMPTS_PREFIX,
        protocol.LAST_ERROR_PREFIX,
        protocol.LOST_PREFIX,
        protocol.MISSING_PHASE_TASK,
        protocol.TASK_UNCLAIMED,
    }
    for name, spec in SPECS.items():
        assert not spec.words & kept, (name, spec.words & kept)
    assert not (REDIS_WORDS | VALUES) & kept


def test_prelude_values_are_plain_lua_strings() -> None:
    # The prelude quotes each value as '...': one holding a quote or a backslash would break it.
    for name, source in _definitions():
        if source.startswith(f"local {name} = '"):
            value = source.removeprefix(f"local {name} = '").removesuffix("'")
            assert "'" not in value and "\\" not in value, name


# -- KEYS and ARGV -------------------------------------------------------------------------------

_NAMED_KEYS = re.compile(r"^local ([\w, ]+) = (KEYS\[\d+\](?:, KEYS\[\d+\])*)$", re.MULTILINE)
_NAMED_ARGS = re.compile(r"^local ([\w,\s]+?) =\s*unpack\(ARGV, 1, (\d+)\)", re.MULTILINE)


def test_where_a_script_names_its_keys_and_args_they_are_its_specs() -> None:
    named = 0
    for name, path in lua_files().items():
        body, spec = path.read_text(), SPECS[name]
        for m in _NAMED_KEYS.finditer(body):
            names = [n.strip() for n in m.group(1).split(",")]
            indexes = [int(i) for i in re.findall(r"\d+", m.group(2))]
            for local, i in zip(names, indexes, strict=True):
                assert i <= len(spec.keys) and spec.keys[i - 1] == local, f"{name}.lua: KEYS[{i}] is {local}"
            named += 1
        for m in _NAMED_ARGS.finditer(body):
            names = [n.strip() for n in m.group(1).split(",")]
            assert int(m.group(2)) == len(names), name
            assert tuple(names) == spec.args, f"{name}.lua names ARGV {names}, its spec {list(spec.args)}"
            named += 1
    assert named > 30  # the patterns still match how the scripts are written


def test_no_script_reads_keys_or_args_past_its_spec() -> None:
    for name, path in lua_files().items():
        body, spec = path.read_text(), SPECS[name]
        code = "\n".join(line.split("--", 1)[0] for line in body.splitlines())
        for what, named, more in (("KEYS", spec.keys, spec.more_keys), ("ARGV", spec.args, spec.more_args)):
            used = [int(i) for i in re.findall(rf"{what}\[(\d+)\]", code)]
            if not more:
                assert max(used, default=0) <= len(named), f"{name}.lua reads {what}[{max(used)}]"
                assert f"#{what}" not in code, f"{name}.lua reads a variable number of {what}"


def test_a_call_with_another_number_of_keys_or_args_is_refused_before_it_is_sent() -> None:
    client = redis.Redis(port=1)  # never connected: the check comes first
    cancel = register_script(client, "cancel")
    with pytest.raises(ScriptCallError, match=r"cancel.lua takes 1 KEYS \(run\), not 2"):
        cancel(keys=["a", "b"], args=[])
    with pytest.raises(ScriptCallError, match="ARGV"):
        cancel(keys=["a"], args=["x"])
    create = register_script(client, "create")
    with pytest.raises(ScriptCallError, match="6 or more KEYS"):
        create(keys=["k"] * 5, args=["a"] * 7)
    renew = register_script(client, "renew")
    with pytest.raises(ScriptCallError, match="takes 5 ARGV"):
        renew(keys=["k"] * 2, args=["a"] * 6)
    assert cancel.script == script_source("cancel")


# -- the Lua helpers build what the Python functions build ----------------------------------------


def test_the_lua_helpers_agree_with_protocol_py(rds: redis.Redis) -> None:
    body = (
        "return {attempts_field(ARGV[1], ARGV[2]), last_error_field(ARGV[1], ARGV[2]), lost_field(ARGV[1]),"
        " variant_field(ARGV[1], EVAL_DONE), call_claim(ARGV[1], ARGV[2]), throttled_info(ARGV[3], 7)}"
    )
    reply = rds.eval(protocol.lua_prelude(body) + body, 0, "12", "call:3:c1", '{"limit":"x"}')
    assert [r.decode() if isinstance(r, bytes) else r for r in reply] == [
        protocol.attempts_field(12, "call:3:c1"),
        protocol.last_error_field(12, "call:3:c1"),
        protocol.lost_field(12),
        protocol.variant_field(12, protocol.EVAL_DONE),
        protocol.call_claim(12, "call:3:c1"),
        '{"limit":"x","until":7}',
    ]


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def test_the_python_side_reads_the_task_states_the_prelude_writes() -> None:
    from typing import get_args

    from shared.store import TaskState

    assert set(get_args(TaskState)) == {
        protocol.TASK_DONE,
        protocol.TASK_LIVE,
        protocol.TASK_EXPIRED,
        protocol.TASK_UNCLAIMED,
    }


def test_the_loader_finds_every_lua_file_of_the_package_by_its_name() -> None:
    # A script placed where script_files() does not look (shared/lua/, shared/<feature>/lua/)
    # would be in the package but never loaded.
    assert {name: str(path) for name, path in lua_files().items()} == {
        name: str(f) for name, f in script_files().items()
    }
    assert set(script_files()) == set(SPECS)
    assert "pipe_create" in {
        p.stem for p in (Path(str(resources.files("shared.pipeline"))) / "lua").iterdir()
    }


def test_two_lua_files_of_one_name_are_refused(tmp_path: Path) -> None:
    for where in ("lua", "pipeline/lua", "evals/lua", "evals/lua/nested"):
        (tmp_path / where).mkdir(parents=True, exist_ok=True)
    (tmp_path / "lua" / "create.lua").write_text("return 1")
    (tmp_path / "evals" / "lua" / "eval_create.lua").write_text("return 1")
    (tmp_path / "evals" / "lua" / "nested" / "create.lua").write_text("return 1")
    (tmp_path / "pipeline" / "lua" / "notes.txt").write_text("not a script")
    assert sorted(_find_scripts(tmp_path)) == ["create", "eval_create"]
    (tmp_path / "pipeline" / "lua" / "create.lua").write_text("return 2")
    with pytest.raises(ScriptNameError, match="two Lua scripts are named 'create'"):
        _find_scripts(tmp_path)


def test_a_non_editable_install_carries_every_lua_file() -> None:
    # setuptools copies package data only where pyproject.toml's globs say.
    globs = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["shared"]
    root = Path(str(resources.files("shared")))
    missed = [
        str(p.relative_to(root))
        for p in root.rglob("*.lua")
        if not any(fnmatch.fnmatchcase(p.relative_to(root).as_posix(), g) for g in globs)
    ]
    assert not missed, f"Lua files left out of package-data: {missed}"
