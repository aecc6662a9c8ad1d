"""``client.assistants``: create, change, read, compare and roll back a tenant's assistants.

An assistant is checked, when it is saved, against what the live workers advertise its agent lets
assistants configure (``AgentInfo.configurable``, from the agent's ``Configurable``): the producer
needs no agent code for it. The worker checks it again when a run of it starts. The semantics
(versions, rollback, what a run is pinned to) are in ``shared/assistants.py`` and
``shared/assistant_store.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.assistant_store import AssistantStore, AssistantSummary
from shared.assistants import AssistantConfig, AssistantVersion, FieldChange, check_config

if TYPE_CHECKING:
    from producer.client import Client

__all__ = ["Assistants"]


class Assistants:
    """A client's assistants; every call names the ``tenant`` (None: the tenant-less runs')."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.store = AssistantStore(client.store.redis, client.store.keys)

    def create(
        self,
        name: str,
        agent: str,
        config: AssistantConfig | dict[str, Any],
        *,
        tenant: str | None = None,
        check_agent: bool = True,
    ) -> AssistantVersion:
        """Version 1 of a new assistant of ``agent``; raises :class:`~shared.assistants.AssistantInvalid`
        naming a field the agent does not let assistants configure, ``AssistantExists`` for a
        taken name, and (with ``check_agent``) ``UnknownAgent``/``NoLiveWorker`` as ``submit`` does."""
        parsed = AssistantConfig.parse(config)
        if check_agent:
            self._check(agent, parsed)
        return self.store.create(tenant, name, agent, parsed)

    def update(
        self,
        name: str,
        config: AssistantConfig | dict[str, Any],
        *,
        tenant: str | None = None,
        if_version: int | None = None,
        check_agent: bool = True,
    ) -> AssistantVersion:
        """A new version whose configuration is ``config`` as a whole (a field left out is the
        agent's own); with ``if_version``, only while that is the current version
        (``AssistantConflict`` otherwise). Runs already created keep their version."""
        parsed = AssistantConfig.parse(config)
        current = self.store.get(tenant, name)
        if check_agent:
            self._check(current.agent, parsed)
        return self.store.update(tenant, name, parsed, if_version=if_version)

    def rollback(
        self,
        name: str,
        version: int,
        *,
        tenant: str | None = None,
        if_version: int | None = None,
        check_agent: bool = True,
    ) -> AssistantVersion:
        """A new version equal to ``version`` (checked against the agent as it is now)."""
        old = self.store.get(tenant, name, version)
        if check_agent:
            self._check(old.agent, old.config)
        return self.store.rollback(tenant, name, version, if_version=if_version)

    def delete(self, name: str, *, tenant: str | None = None) -> None:
        """Delete an assistant: no new run, read or change names it any more, and it leaves the
        tenant's count; runs already pinned to one of its versions go on with it (its versions are
        kept for the runs' retention). Creating the name again continues its version numbers."""
        self.store.delete(tenant, name, keep_s=self._client.settings.retention_s)

    def get(self, name: str, *, version: int | None = None, tenant: str | None = None) -> AssistantVersion:
        """One version of an assistant (None: the current one)."""
        return self.store.get(tenant, name, version)

    def versions(
        self, name: str, *, tenant: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[AssistantVersion]:
        """An assistant's versions, newest first."""
        return self.store.versions(tenant, name, before=before, limit=limit)

    def diff(self, name: str, before: int, after: int, *, tenant: str | None = None) -> list[FieldChange]:
        """The fields that differ from version ``before`` to version ``after``."""
        return self.store.diff(tenant, name, before, after)

    def list(
        self, *, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[AssistantSummary]:
        """The tenant's assistants, in name order."""
        return self.store.list(tenant, after=after, limit=limit)

    def _check(self, agent: str, config: AssistantConfig) -> None:
        check_config(agent, config, self._client.served(agent).configurable)
