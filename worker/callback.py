"""Telling a service that a run ended: the ended run's last task.

The terminal commit puts a ``wesichain.callback`` task in the run's outbox and keeps the run under
the sweeper's watch until the callback is delivered or given up, so a worker that dies between the
commit and the delivery costs nothing: the task is published again. A delivery claims the run (its
phase claim, at the terminal version) like any phase, so two deliveries never run at once, and
records each attempt on the run (``RunHandle.callback()``).

* A webhook gets a POST of the run's outcome, signed per Standard Webhooks under the tenant's
  secret, with the run id as ``webhook-id`` on every attempt: delivery is at least once, and the
  receiver de-duplicates on it. Any 2xx answer is delivered; anything else is tried again after
  ``Settings.webhook_retry_s`` (at most that many times), then given up.
* A Celery callback is sent by name with the outcome as its one argument and the task id
  ``<run_id>:callback`` (at least once; a receiver de-duplicates on the id). A task the worker
  itself serves (``Runtime.local_callbacks``, e.g. an eval's scoring) runs in place when no queue
  is named, as a plain call under the callback's claim, given the stored run the claim read: the
  worker that ended the run delivers it right after the terminal commit, without publishing it
  (see ``Runtime.commit``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from shared import protocol
from shared.errors import InvalidRequest
from shared.queues import queue_in
from shared.state import Callback, CallbackState, Phase, RunHead, TaskSpec
from shared.store import Claim, PhaseClaim
from shared.tasks import task_for
from worker.runtime import Delivery, Runtime

if TYPE_CHECKING:
    # Loaded on a webhook's first delivery: httpx (and what it loads) costs a worker that never
    # posts one several MiB in every process.
    import httpx

# The outcome's form and its signing (shared/webhooks.py) and the tenants' secrets
# (shared/tenants.py) load on a run's first callback, as httpx does: about 120 KiB in every
# process (the main one and each pool child) of a worker whose runs name no callback. Both are
# the package's own pure-Python modules, with nothing configured to find at start-up.

__all__ = ["run_callback"]

log = logging.getLogger("wesichain.callback")

_client_lock = threading.Lock()
_clients: dict[tuple[int, bool], httpx.Client] = {}


def run_callback(rt: Runtime, delivery: Delivery, step: int, phase: str) -> None:
    # Where the callback stands and its attempts so far are read with the claim.
    want = PhaseClaim(
        delivery.run_id, delivery.version, Phase(phase), delivery.epoch, step, read_callback=True
    )
    claim = rt.store.claim_phase(want, rt.holder())
    if not isinstance(claim, Claim):
        rt.on_unclaimed(claim, delivery)
        return
    head = claim.head
    pending, raw_state = claim.callback or (None, None)
    if pending != protocol.CALLBACK_PENDING or head.callback is None:
        # Delivered (or given up) already: nothing to do.
        rt.store.release(head.run_id, claim.field, claim.token, head.version)
        return
    state = CallbackState.model_validate_json(raw_state) if raw_state else CallbackState()
    attempt = state.attempts + 1
    schedule = rt.settings.webhook_retry_s
    error, code = _deliver(rt, head, head.callback)
    state = state.model_copy(update={"attempts": attempt, "last_error": error, "last_status_code": code})
    if error is None:
        state = state.model_copy(
            update={"status": "delivered", "delivered_at": time.time(), "next_attempt_at": None}
        )
        _finish(rt, head, claim, "delivered", state)
        return
    if attempt > len(schedule) or claim.attempts > len(schedule) + rt.settings.max_phase_attempts:
        log.warning("run %s: callback given up after %d attempt(s): %s", head.run_id, attempt, error)
        _finish(
            rt,
            head,
            claim,
            "gave_up",
            state.model_copy(update={"status": "gave_up", "next_attempt_at": None}),
        )
        return
    wait_s = schedule[attempt - 1]
    log.info("run %s: callback attempt %d failed (%s); next in %gs", head.run_id, attempt, error, wait_s)
    state = state.model_copy(update={"next_attempt_at": time.time() + wait_s})
    if _finish(rt, head, claim, "retry", state, wait_s):
        (task,) = task_for(head)
        rt.publish([task.model_copy(update={"countdown": wait_s})], head.epoch)


def _finish(
    rt: Runtime, head: RunHead, claim: Claim, outcome_: str, state: CallbackState, wait_s: float = 0
) -> bool:
    return rt.store.finish_callback(head.run_id, claim.token, outcome_, state.model_dump_json(), wait_s)


def _deliver(rt: Runtime, head: RunHead, callback: Callback) -> tuple[str | None, int | None]:
    """One attempt; returns (the error, the HTTP status) — (None, status) when delivered."""
    if callback.task is not None:
        local = rt.local_callbacks.get(callback.task) if callback.queue is None else None
        if local is not None:
            # A task this worker serves itself runs here, under the callback's claim: one hop
            # less, and a crash mid-way leaves the callback pending for the sweeper to redo. It is
            # given the run as this claim read it from the store, not read again.
            local(head)
            return None, None
        from shared.webhooks import outcome

        spec = TaskSpec(
            name=callback.task,
            task_id=f"{head.run_id}:callback",
            arguments={},
            args=[outcome(head)],
            # A run in a queue namespace has a callback that names no queue sent to that
            # namespace's model queue, like its other tasks, not to the default routes.
            queue=callback.queue or (queue_in(head.namespace, "model") if head.namespace else None),
        )
        try:
            rt.send(spec)
        except Exception as exc:  # the broker refused it: try again later
            return f"{type(exc).__name__}: {exc}"[:500], None
        return None, None
    from shared.webhooks import outcome_bytes, signed_headers, webhook_endpoint

    url = callback.url or ""
    try:
        # The URL's form only: its host is resolved and checked by the client, once, for the
        # connection made to the very addresses checked (shared/webhook_client.py).
        webhook_endpoint(url)
        secret = _secret(rt, head)
    except InvalidRequest as exc:
        return exc.message, None
    body = outcome_bytes(head)
    import httpx

    try:
        # Streamed, and its body never read: only the status says anything, and a receiver could
        # answer with a body without end. The exchange up to the status has a deadline of its own
        # (``shared/webhook_client.py``), however slowly the receiver sends it.
        with _client(rt).stream(
            "POST", url, content=body, headers=signed_headers(secret, head.run_id, body)
        ) as response:
            status = response.status_code
    except InvalidRequest as exc:  # the host reaches a refused address, or does not resolve
        return exc.message, None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"{type(exc).__name__}: {exc}"[:500], None
    if 200 <= status < 300:
        return None, status
    return f"the receiver answered HTTP {status}", status


def _secret(rt: Runtime, head: RunHead) -> str:
    if head.tenant is not None:
        from shared.tenants import Tenants

        return Tenants(rt.store.redis, rt.store.keys).webhook_secret(head.tenant)
    if not rt.settings.webhook_secret:
        raise InvalidRequest(
            "a webhook of a run without a tenant needs WESICHAIN_WEBHOOK_SECRET (whsec_...) on the workers"
        )
    return rt.settings.webhook_secret


def _client(rt: Runtime) -> httpx.Client:
    """One pooled HTTP client per process (prefork children get their own) that connects only to
    checked addresses."""
    key = (os.getpid(), rt.settings.webhook_allow_private)
    with _client_lock:
        client = _clients.get(key)
        if client is None:
            from shared.webhook_client import webhook_client

            client = webhook_client(
                timeout_s=rt.settings.webhook_timeout_s, allow_private=rt.settings.webhook_allow_private
            )
            _clients[key] = client
        return client
