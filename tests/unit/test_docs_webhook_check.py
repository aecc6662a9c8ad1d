"""The webhook signature check docs/api.md shows accepts what the workers sign, and nothing else."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.webhooks import new_secret, signed_headers

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def documented_check() -> Callable[[str, dict[str, str], bytes], bool]:
    blocks = re.findall(r"```python\n(.*?)```", API_DOC.read_text(), re.S)
    source = next(b for b in blocks if "def verified(" in b)
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    check: Callable[[str, dict[str, str], bytes], bool] = namespace["verified"]
    return check


def test_the_documented_check_accepts_signed_bodies_only() -> None:
    verified = documented_check()
    secret = new_secret()
    body = b'{"type":"run.ended","run_id":"r1"}'
    headers = signed_headers(secret, "r1", body)
    assert verified(secret, headers, body)
    assert not verified(secret, headers, body + b" ")
    assert not verified(new_secret(), headers, body)
    stale = signed_headers(secret, "r1", body, now=time.time() - 600)
    assert not verified(secret, stale, body)
    rotated = {**headers, "webhook-signature": "v1,bm90LWl0 " + headers["webhook-signature"]}
    assert verified(secret, rotated, body)
