"""Where assistants live: per tenant, each one's immutable versions, the newest the current one.

Every key carries the tenant (``Keys.assistant_versions``, ``Keys.assistants``) and every method
takes it: a tenant reads, changes and runs only its own assistants, and another tenant's name is
as unknown as a name never created. A version is appended once (``assistant_put.lua``) and never
rewritten, so a run pinned to it finds it as it was for as long as the run lives.

A deleted assistant (``assistant_delete.lua``) leaves the tenant's index: no request reads, lists,
changes or runs it, and it no longer counts against ``MAX_ASSISTANTS``. Its versions are kept
``keep_s`` seconds (the runs' retention) for the runs already pinned to one of them, which go on
with it (:meth:`AssistantStore.get` with ``deleted=True``: the runtime's read of a pinned version).
Creating the name again meanwhile continues their numbering: a version number never means two
configurations.

The bytes of every version a tenant's Redis holds count against its ``max_assistant_bytes``
(``TenantLimits``), a deleted assistant's kept versions included until they expire: otherwise
creating, filling and deleting names would let one tenant fill Redis with versions nobody lists.
A change past the quota raises :class:`AssistantsFull`, saying when the next deleted assistant's
versions stop counting.

A rollback appends a new version equal to the old one (``restored_from`` says which) rather than
moving a pointer back: the list of versions stays the history of what was current when, "current"
is always the newest, and a run started after the rollback records a version that did not exist
before it (nothing reads an older number and finds it meant something else then).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from shared.assistants import (
    AssistantConfig,
    AssistantConflict,
    AssistantExists,
    AssistantInvalid,
    AssistantVersion,
    FieldChange,
    UnknownAssistant,
    diff_configs,
)
from shared.configurable import check_assistant_name
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.request import RunRequest
from shared.scripts import register_script
from shared.tenants import Tenants

__all__ = ["AssistantStore", "AssistantSummary", "AssistantsFull", "MAX_ASSISTANTS", "MAX_VERSIONS"]

#: The most assistants one tenant may have, and versions one assistant may have.
MAX_ASSISTANTS = 500
MAX_VERSIONS = 1000


class AssistantsFull(InvalidRequest):
    """The tenant's assistants' versions hold its ``max_assistant_bytes`` already: ``details`` give
    the quota, the bytes held, and when (epoch seconds; None: never by itself) the next deleted
    assistant's versions expire and stop counting."""

    def __init__(self, limit: int, held: int, frees_at: float | None) -> None:
        when = f"; a deleted assistant's versions stop counting at {frees_at:.0f}" if frees_at else ""
        super().__init__(
            f"the tenant's assistants hold {held} of their {limit} bytes: this version does not fit{when}",
            max_assistant_bytes=limit,
            held_bytes=held,
            frees_at=frees_at,
        )
        self.limit = limit


@dataclass(frozen=True)
class AssistantSummary:
    """An assistant in a listing: its name, agent, and current (newest) version."""

    name: str
    agent: str
    version: int
    updated_at: float


class AssistantStore:
    """A deployment's assistants, every call scoped by its ``tenant`` (None: the tenant-less runs').

    ``max_bytes`` gives a tenant's byte quota (default: its ``TenantLimits``, read at each change,
    so an operator's change applies at once)."""

    def __init__(
        self, client: redis.Redis, keys: Keys, max_bytes: Callable[[str | None], int] | None = None
    ) -> None:
        self.redis = client
        self.keys = keys
        tenants = Tenants(client, keys)
        self.max_bytes = max_bytes or (lambda tenant: tenants.limits(tenant).max_assistant_bytes)
        self._put = register_script(client, "assistant_put")
        self._delete = register_script(client, "assistant_delete")

    def create(self, tenant: str | None, name: str, agent: str, config: AssistantConfig) -> AssistantVersion:
        """Version 1 of a new assistant (:class:`AssistantExists` if the name is taken)."""
        check_assistant_name(name)
        return self._append(tenant, name, agent, config, "create", None, None)

    def update(
        self, tenant: str | None, name: str, config: AssistantConfig, *, if_version: int | None = None
    ) -> AssistantVersion:
        """A new version with ``config`` (the whole configuration: fields left out are the agent's
        own); with ``if_version``, only while that is still the current version."""
        current = self.get(tenant, name)
        return self._append(tenant, name, current.agent, config, "update", if_version, None)

    def rollback(
        self, tenant: str | None, name: str, version: int, *, if_version: int | None = None
    ) -> AssistantVersion:
        """A new version whose configuration is ``version``'s."""
        old = self.get(tenant, name, version)
        return self._append(tenant, name, old.agent, old.config, "rollback", if_version, version)

    def get(
        self, tenant: str | None, name: str, version: int | None = None, *, deleted: bool = False
    ) -> AssistantVersion:
        """One version (None: the current one); :class:`UnknownAssistant` if there is none, or if
        the assistant was deleted (unless ``deleted``: a run pinned to a version reads it still)."""
        check_assistant_name(name)
        key = self.keys.assistant_versions(tenant, name)
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            raise InvalidRequest(f"an assistant version is a number from 1, got {str(version)[:20]!r}")
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.lindex(key, -1 if version is None else version - 1)
            pipe.llen(key)
            pipe.zscore(self.keys.assistants(tenant), name)
            raw, count, listed = pipe.execute()
        if not count or (listed is None and not deleted):
            raise UnknownAssistant(f"no assistant {name!r}")
        if raw is None:
            raise UnknownAssistant(f"assistant {name!r} has no version {version}")
        return _parse(name, raw, version if version is not None else int(count))

    def delete(self, tenant: str | None, name: str, *, keep_s: int) -> None:
        """Delete an assistant (:class:`UnknownAssistant` if the tenant has none of that name); its
        versions stay readable to the runs pinned to them for ``keep_s`` seconds."""
        check_assistant_name(name)
        keys = [
            self.keys.assistant_versions(tenant, name),
            self.keys.assistants(tenant),
            self.keys.assistants_kept(tenant),
        ]
        if int(self._delete(keys, [name, max(1, int(keep_s))])) == 0:
            raise UnknownAssistant(f"no assistant {name!r}")

    def versions(
        self, tenant: str | None, name: str, *, before: int | None = None, limit: int = 50
    ) -> list[AssistantVersion]:
        """Versions newest first, ``limit`` of them below ``before`` (None: from the current one)."""
        check_assistant_name(name)
        if not 1 <= limit <= 500:
            raise InvalidRequest(f"limit must be in 1..500, got {limit}")
        key = self.keys.assistant_versions(tenant, name)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.llen(key)
            pipe.zscore(self.keys.assistants(tenant), name)
            count, listed = pipe.execute()
        if not count or listed is None:
            raise UnknownAssistant(f"no assistant {name!r}")
        count = int(count)
        top = min(count, before - 1) if before is not None else count
        if top < 1:
            return []
        low = max(1, top - limit + 1)
        raws = self.redis.lrange(key, low - 1, top - 1)
        return [_parse(name, raw, low + i) for i, raw in enumerate(raws)][::-1]

    def pin(self, request: RunRequest) -> tuple[RunRequest, AssistantVersion | None]:
        """A run's request with its assistant resolved to a version of its tenant's (the current
        one unless it names one), and that version; :class:`UnknownAssistant` for a name the
        tenant has not, :class:`AssistantInvalid` for an assistant of another agent."""
        if request.assistant is None:
            return request, None
        found = self.get(request.tenant, request.assistant, request.assistant_version)
        if found.agent != request.agent:
            raise AssistantInvalid(
                "agent", f"assistant {found.name!r} configures agent {found.agent!r}, not {request.agent!r}"
            )
        return request.model_copy(update={"assistant_version": found.version}), found

    def diff(self, tenant: str | None, name: str, before: int, after: int) -> list[FieldChange]:
        """The fields that differ from version ``before`` to version ``after``."""
        return diff_configs(self.get(tenant, name, before).config, self.get(tenant, name, after).config)

    def list(
        self, tenant: str | None, *, after: str | None = None, limit: int = 100
    ) -> list[AssistantSummary]:
        """The tenant's assistants in name order, ``limit`` of them after the name ``after``."""
        if not 1 <= limit <= 500:
            raise InvalidRequest(f"limit must be in 1..500, got {limit}")
        low = "-" if after is None else "(" + check_assistant_name(after)
        names = [_text(n) for n in self.redis.zrangebylex(self.keys.assistants(tenant), low, "+", 0, limit)]
        if not names:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.lindex(self.keys.assistant_versions(tenant, name), -1)
                pipe.llen(self.keys.assistant_versions(tenant, name))
            replies = pipe.execute()
        found = []
        for i, name in enumerate(names):
            raw, count = replies[2 * i], replies[2 * i + 1]
            if raw is not None:
                current = _parse(name, raw, int(count))
                found.append(AssistantSummary(name, current.agent, current.version, current.created_at))
        return found

    def _append(
        self,
        tenant: str | None,
        name: str,
        agent: str,
        config: AssistantConfig,
        mode: str,
        if_version: int | None,
        restored_from: int | None,
    ) -> AssistantVersion:
        created_at = time.time()
        record = _Record(agent=agent, config=config, created_at=created_at, restored_from=restored_from)
        max_bytes = self.max_bytes(tenant)
        status, number, *more = self._put(
            [
                self.keys.assistant_versions(tenant, name),
                self.keys.assistants(tenant),
                self.keys.assistant_sizes(tenant),
                self.keys.assistants_kept(tenant),
            ],
            [
                name,
                mode,
                record.dump(),
                "" if if_version is None else if_version,
                MAX_VERSIONS,
                MAX_ASSISTANTS,
                max_bytes,
            ],
        )
        status, number = _text(status), int(number)
        if status == "over":
            frees_at_ms = int(more[0]) if more else 0
            raise AssistantsFull(max_bytes, number, frees_at_ms / 1000 if frees_at_ms else None)
        if status == "exists":
            raise AssistantExists(f"assistant {name!r} exists already (version {number}): update it instead")
        if status == "missing":
            raise UnknownAssistant(f"no assistant {name!r}")
        if status == "moved":
            raise AssistantConflict(
                f"assistant {name!r} is at version {number}, not {if_version}: read it again and retry"
            )
        if status == "spent":
            raise AssistantInvalid(
                "name", f"the name {name!r} has had its most versions ({MAX_VERSIONS}): choose another"
            )
        if status == "full":
            if mode == "create":
                raise AssistantInvalid("name", f"a tenant may have at most {MAX_ASSISTANTS} assistants")
            raise AssistantInvalid("version", f"assistant {name!r} has its most versions ({MAX_VERSIONS})")
        return AssistantVersion(
            name=name,
            agent=agent,
            version=number,
            config=config,
            created_at=created_at,
            restored_from=restored_from,
        )


@dataclass(frozen=True)
class _Record:
    """A version as stored: its number is its place in the list, its name the list's."""

    agent: str
    config: AssistantConfig
    created_at: float
    restored_from: int | None

    def dump(self) -> str:
        return AssistantVersion(
            name="",
            agent=self.agent,
            version=0,
            config=self.config,
            created_at=self.created_at,
            restored_from=self.restored_from,
        ).model_dump_json(exclude={"name", "version"})


def _parse(name: str, raw: Any, version: int) -> AssistantVersion:
    return AssistantVersion.model_validate({**json.loads(_text(raw)), "name": name, "version": version})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
