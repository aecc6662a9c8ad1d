"""The worker's side of the shared provider limits (``shared/limits.py``).

:class:`ModelGate` finds the limit of a think's model, takes capacity for the call, keeps the
call's concurrency slot alive while it runs (one renewal thread per process, like the claims'
heartbeat) and gives the capacity back when the HTTP call really ends, on whichever thread that
is: a call given up by a cancel keeps its slot until its connection is closed, so the provider
never sees more calls at once than the limit. A 429 from the provider is not waited out in the
worker thread (:data:`~shared.llm.retry.RAISE_RATE_LIMITED`): it becomes a back-off of the shared
limit, so every worker waits, and the think is re-queued (``worker/limited_call.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextvars import Token
from dataclasses import dataclass

import redis

from shared.agents import Agent, AgentRegistry
from shared.errors import ModelTransport
from shared.limits import (
    Denied,
    Grant,
    ProviderLimit,
    RateLimiter,
    Throttled,
    find_limit,
    scope_of,
)
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse, StreamPart
from shared.llm.retry import RAISE_RATE_LIMITED
from shared.settings import Settings
from shared.state import RunHead
from shared.store import RunStore

__all__ = [
    "DEFAULT_BACK_OFF_S",
    "LimitedAdapter",
    "MAX_BACK_OFF_S",
    "ModelGate",
    "estimate_tokens",
    "model_gate",
]

log = logging.getLogger("wesichain.limits")

#: How long the pool backs off after a 429 that did not say (no Retry-After).
DEFAULT_BACK_OFF_S = 1.0
#: The longest back-off a provider's Retry-After can impose on the pool.
MAX_BACK_OFF_S = 300.0


def estimate_tokens(request: ModelRequest) -> int:
    """A rough count of the tokens a request sends (four characters a token), charged up front;
    the call is charged what it really used when it ends."""
    chars = sum(len(getattr(m, "content", None) or "") for m in request.messages)
    chars += sum(len(t.description) + len(str(t.parameters)) for t in request.tools)
    return chars // 4 + 1


@dataclass(frozen=True)
class _Limit:
    scope: str
    limit: ProviderLimit


class ModelGate:
    """A worker process's view of the shared limits: which apply, and the slots it holds."""

    def __init__(self, limiter: RateLimiter, limits: Mapping[str, ProviderLimit], renew_s: float) -> None:
        self.limiter = limiter
        self.limits = dict(limits)
        self.renew_s = renew_s
        self._held: dict[str, Grant] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def limit_for(self, head: RunHead, agent: Agent) -> _Limit | None:
        """The limit a think of ``head`` counts against: the settings' for its model, else its
        agent's own (only for the agent's own model), else none."""
        found = find_limit(self.limits, head.model)
        if found is None and agent.limits is not None and head.model == agent.model:
            provider, _, name = head.model.removeprefix("react+").partition(":")
            found = (f"{provider}:{name}", agent.limits)
        if found is None:
            return None
        model, limit = found
        return _Limit(scope_of(model, limit, head.tenant), limit)

    def limit_for_model(self, model: str, tenant: str | None) -> _Limit | None:
        """The settings' limit of any other call of ``model`` (an eval's judge): the same scope,
        so the same buckets and slots, as the thinks of that model and tenant."""
        found = find_limit(self.limits, model)
        if found is None:
            return None
        name, limit = found
        return _Limit(scope_of(name, limit, tenant), limit)

    def admit(self, limit: _Limit, request: ModelRequest) -> Grant:
        """Capacity for one call, or :class:`Throttled`."""
        outcome = self.limiter.acquire(limit.scope, limit.limit, estimate_tokens(request))
        if isinstance(outcome, Denied):
            raise Throttled(outcome.scope, outcome.reason, outcome.wait_s)
        if limit.limit.concurrency:
            with self._lock:
                self._held[outcome.holder] = outcome
                self._ensure_thread()
        return outcome

    def finish(self, grant: Grant, used_tokens: int | None, back_off_s: float | None) -> None:
        """The call ended: give its capacity back, charge its tokens, pass a 429 on to the pool."""
        with self._lock:
            self._held.pop(grant.holder, None)
        back_off = None if back_off_s is None else min(max(back_off_s, 0.0), MAX_BACK_OFF_S)
        try:
            self.limiter.release(grant, used_tokens, back_off)
        except redis.RedisError as exc:  # its lease frees the slot anyway
            log.warning("could not release a slot of %s: %s", grant.scope, exc)

    def back_off(self, limit: _Limit, seconds: float | None) -> None:
        self.limiter.back_off(limit.scope, limit.limit, min(seconds or DEFAULT_BACK_OFF_S, MAX_BACK_OFF_S))

    # -- the renewal thread ------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        # One per process: a prefork child inherits the object but not the thread.
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="wesichain-slots", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.renew_s)
            with self._lock:
                held = list(self._held.values())
            if not held:
                continue
            try:
                kept = self.limiter.renew(held)
            except redis.RedisError as exc:
                log.warning("renewing %d provider slot(s) failed: %s", len(held), exc)
                continue
            for grant, ok in zip(held, kept, strict=True):
                if not ok:
                    log.warning("a slot of %s expired while its call ran (a stalled process?)", grant.scope)


def model_gate(
    store: RunStore, agents: AgentRegistry, settings: Settings, renew_s: float
) -> ModelGate | None:
    """The gate of a worker process, or None when neither the settings nor an agent set a limit."""
    if not settings.provider_limits and not any(agents.get(n).limits for n in agents.names):
        return None
    limiter = RateLimiter(store.redis, store.keys, settings.lease_s)
    return ModelGate(limiter, settings.provider_limits, renew_s)


class LimitedAdapter:
    """An adapter whose call holds ``grant`` until the HTTP call really ends."""

    def __init__(self, inner: LlmAdapter, gate: ModelGate, grant: Grant) -> None:
        self.inner = inner
        self.gate = gate
        self.grant = grant
        self._done = False
        self._lock = threading.Lock()

    def _finish(self, used: int | None, back_off: float | None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.gate.finish(self.grant, used, back_off)

    def complete(self, request: ModelRequest) -> ModelResponse:
        token = RAISE_RATE_LIMITED.set(True)
        used: int | None = None
        back_off: float | None = None
        try:
            response = self.inner.complete(request)
            used = response.usage.input_tokens + response.usage.output_tokens
            return response
        except ModelTransport as exc:
            back_off = _back_off(exc)
            raise
        finally:
            RAISE_RATE_LIMITED.reset(token)
            self._finish(used, back_off)

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        token = RAISE_RATE_LIMITED.set(True)
        used: int | None = None
        back_off: float | None = None
        try:
            for part in self.inner.stream(request):
                if isinstance(part, ModelResponse):
                    used = part.usage.input_tokens + part.usage.output_tokens
                yield part
        except ModelTransport as exc:
            back_off = _back_off(exc)
            raise
        finally:
            _reset(token)
            self._finish(used, back_off)


def _reset(token: Token[bool]) -> None:
    try:
        RAISE_RATE_LIMITED.reset(token)
    except ValueError:  # a stream closed from another context (garbage collected elsewhere)
        pass


def _back_off(exc: ModelTransport) -> float | None:
    if exc.status_code != 429:
        return None
    return exc.retry_after_s if exc.retry_after_s is not None else DEFAULT_BACK_OFF_S
