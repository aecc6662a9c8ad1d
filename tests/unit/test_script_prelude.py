"""Each Lua script carries the part of the prelude it uses, and nothing it uses is left out."""

from __future__ import annotations

import re

from shared.protocol import _definitions, lua_prelude
from shared.scripts import script_body, script_files, script_source

PRELUDE_NAMES = [name for name, _ in _definitions()]


def _lua_files() -> list[str]:
    return sorted(script_files())


def _defined(source: str) -> set[str]:
    return set(re.findall(r"^local (?:function )?(\w+)", source, flags=re.MULTILINE))


def test_the_prelude_splits_into_every_field_phase_and_helper() -> None:
    assert len(PRELUDE_NAMES) == len(set(PRELUDE_NAMES))
    for name in (
        "F_VERSION",
        "P_ACTING",
        "TERMINAL",
        "PUSH_COMMANDS",
        "push_broker",
        "now_ms",
        "claim_parts",
        "claim_value",
        "call_claim",
        "has_call",
        "task_states",
        "split_calls",
        "attempts_field",
        "last_error_field",
        "lost_field",
        "CALLBACK_PENDING",
        "PIPE_STATUS",
        "EVAL_STATUS",
        "LIMIT_TPM",
    ):
        assert name in PRELUDE_NAMES, name
    # Nothing is lost in the split: the whole prelude is every definition, in order.
    assert lua_prelude() == "".join(source + "\n" for _, source in _definitions())


def test_a_script_gets_what_it_uses_and_what_that_uses() -> None:
    prelude = lua_prelude("local states = task_states(KEYS[1], KEYS[2], 'x', '1', '', 0)\nreturn #states")
    assert _defined(prelude) == {
        "task_states",
        "HANDED_ON",
        "claim_parts",
        "call_claim",
        "CALL_CLAIM_PREFIX",
        "P_ACTING",
        "F_RUNNING",
        "TASK_DONE",
        "TASK_LIVE",
        "TASK_EXPIRED",
        "TASK_UNCLAIMED",
    }
    # Definitions keep the prelude's order, each after what it uses.
    order = re.findall(r"^local (?:function )?(\w+)", prelude, flags=re.MULTILINE)
    assert order == [n for n in PRELUDE_NAMES if n in set(order)]
    assert order.index("call_claim") > order.index("CALL_CLAIM_PREFIX")
    assert order.index("task_states") > order.index("claim_parts")
    assert lua_prelude("return 1") == ""


def test_every_prelude_name_a_script_uses_is_defined_in_its_source() -> None:
    for name in _lua_files():
        source = script_source(name)
        body = script_body(name)
        used = set(re.findall(r"\w+", body)) & set(PRELUDE_NAMES)
        assert used <= _defined(source), f"{name}.lua uses {sorted(used - _defined(source))} undefined"


def test_the_hot_scripts_leave_out_what_they_do_not_use() -> None:
    for name in ("claim_phase", "claim_call", "commit", "record_result"):
        defined = _defined(script_source(name))
        assert "task_states" not in defined and "TERMINAL" not in defined, name
    assert "push_broker" in _defined(script_source("commit"))
    assert "push_broker" not in _defined(script_source("claim_phase"))
