"""Completion webhooks: the body a service receives when a run ends, and how it is signed.

Signing follows the Standard Webhooks specification (standardwebhooks.com), so receivers can use
its libraries: three headers,

* ``webhook-id``: the run id, the same on every attempt (receivers de-duplicate on it);
* ``webhook-timestamp``: Unix seconds of this attempt;
* ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of ``{id}.{timestamp}.{body}`` under
  the secret (``whsec_`` and base64 of the key bytes).

A receiver checks it with :func:`verify` (or any Standard Webhooks library) and refuses stale
timestamps. URLs that resolve to loopback, private, link-local or otherwise non-public addresses
are refused (:func:`check_url`) unless a deployment allows them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from shared.errors import InvalidRequest
from shared.state import RunHead

__all__ = [
    "SECRET_PREFIX",
    "TOLERANCE_S",
    "check_url",
    "new_secret",
    "outcome",
    "outcome_bytes",
    "sign",
    "signed_headers",
    "verify",
]

SECRET_PREFIX = "whsec_"
#: How old a signed timestamp a receiver accepts (replay protection).
TOLERANCE_S = 300


def outcome(head: RunHead) -> dict[str, Any]:
    """What a service is told when a run ends (the webhook's body, the Celery callback's argument)."""
    return {
        "type": "run.ended",
        "run_id": head.run_id,
        "agent": head.agent,
        "tenant": head.tenant,
        "status": head.status,
        "answer": head.answer,
        "error": head.error.model_dump(mode="json") if head.error is not None else None,
        "usage": head.usage.model_dump(mode="json"),
        "steps": head.step,
        "metadata": head.metadata,
        "created_at": head.created_at,
        "ended_at": head.updated_at,
    }


def outcome_bytes(head: RunHead) -> bytes:
    """The exact bytes sent (and signed): compact JSON, keys in a fixed order."""
    return json.dumps(outcome(head), separators=(",", ":"), ensure_ascii=False).encode()


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one attempt."""
    content = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str, message_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None) -> bool:
    """True if ``body`` with ``headers`` was signed with ``secret`` within the tolerance."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        message_id, timestamp = lower["webhook-id"], int(lower["webhook-timestamp"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > TOLERANCE_S:
        return False
    expected = sign(secret, message_id, timestamp, body)
    # The header may carry several space-separated signatures (during a secret's rotation).
    return any(
        hmac.compare_digest(expected, candidate) for candidate in lower.get("webhook-signature", "").split()
    )


def check_url(url: str, *, allow_private: bool = False) -> None:
    """Refuse a webhook URL that is not http(s) or that reaches a non-public address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"a webhook url must be http(s)://host/..., got {url[:80]!r}")
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except OSError as exc:
        raise InvalidRequest(f"webhook host {parts.hostname!r} does not resolve: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            raise InvalidRequest(
                f"webhook url {url[:80]!r} reaches {address}, which is not a public address"
                " (allow private webhook addresses in the deployment's settings to use it)"
            )
