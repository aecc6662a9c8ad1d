"""``wesichain assistants create|update|show|ls|diff|rollback``: straight to Redis as ``--tenant``,
or with ``--api`` (or ``$WESICHAIN_API_URL``) through the HTTP API as the key's tenant."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from producer.api_client import ApiAssistants
from producer.client import Client
from producer.commands import over_api
from shared.assistant_store import AssistantSummary
from shared.assistants import AssistantConfig, AssistantVersion, FieldChange
from shared.errors import InvalidRequest

__all__ = ["run_assistants"]


def _config(text: str) -> dict[str, Any]:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"--config is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("--config must be a JSON object")
    return value


def _print_version(version: AssistantVersion, as_json: bool) -> None:
    if as_json:
        print(version.model_dump_json())
        return
    restored = f" (restored from v{version.restored_from})" if version.restored_from else ""
    print(f"{version.name} v{version.version} of agent {version.agent}{restored}")
    print(json.dumps(version.config.fields_set(), indent=2, sort_keys=True))


class _Over:
    """The assistants' calls the commands make, on Redis (as ``tenant``) or over the API."""

    def __init__(self, args: argparse.Namespace) -> None:
        api = over_api(args)
        if api is not None and args.tenant:
            raise InvalidRequest("--tenant is for Redis: over the API the key's tenant is the one")
        self.api: ApiAssistants | None = api.assistants if api is not None else None
        self.redis = Client.from_env().assistants if api is None else None
        self.tenant: str | None = args.tenant

    def create(self, name: str, agent: str, config: dict[str, Any]) -> AssistantVersion:
        if self.api is not None:
            return self.api.create(name, agent, config)
        assert self.redis is not None
        return self.redis.create(name, agent, config, tenant=self.tenant)

    def update(
        self, name: str, config: AssistantConfig | dict[str, Any], if_version: int | None
    ) -> AssistantVersion:
        if self.api is not None:
            return self.api.update(name, config, if_version=if_version)
        assert self.redis is not None
        return self.redis.update(name, config, tenant=self.tenant, if_version=if_version)

    def rollback(self, name: str, version: int) -> AssistantVersion:
        if self.api is not None:
            return self.api.rollback(name, version)
        assert self.redis is not None
        return self.redis.rollback(name, version, tenant=self.tenant)

    def get(self, name: str, version: int | None) -> AssistantVersion:
        if self.api is not None:
            return self.api.get(name, version=version)
        assert self.redis is not None
        return self.redis.get(name, version=version, tenant=self.tenant)

    def versions(self, name: str) -> list[AssistantVersion]:
        if self.api is not None:
            return self.api.versions(name, limit=500)
        assert self.redis is not None
        return self.redis.versions(name, tenant=self.tenant, limit=500)

    def every(self) -> list[AssistantSummary]:
        if self.api is not None:
            return self.api.list(limit=500)
        assert self.redis is not None
        return self.redis.list(tenant=self.tenant, limit=500)

    def delete(self, name: str) -> None:
        if self.api is not None:
            return self.api.delete(name)
        assert self.redis is not None
        return self.redis.delete(name, tenant=self.tenant)

    def diff(self, name: str, before: int, after: int) -> list[FieldChange]:
        if self.api is not None:
            return self.api.diff(name, before, after)
        assert self.redis is not None
        return self.redis.diff(name, before, after, tenant=self.tenant)


def run_assistants(args: argparse.Namespace) -> int:
    assistants = _Over(args)
    as_json = args.json
    command = args.assistants_command
    if command == "create":
        _print_version(assistants.create(args.name, args.agent, _config(args.config)), as_json)
    elif command == "update":
        _print_version(assistants.update(args.name, _config(args.config), args.if_version), as_json)
    elif command == "rollback":
        _print_version(assistants.rollback(args.name, args.version), as_json)
    elif command == "show" and args.versions:
        for version in assistants.versions(args.name):
            _print_version(version, as_json)
    elif command == "show":
        _print_version(assistants.get(args.name, args.version), as_json)
    elif command == "ls":
        _print_summaries(assistants.every(), as_json)
    elif command == "delete":
        assistants.delete(args.name)
        print(json.dumps({"deleted": args.name}) if as_json else f"deleted {args.name}")
    elif command == "diff":
        _print_changes(assistants.diff(args.name, args.before, args.after), as_json)
    return 0


def _print_summaries(found: list[AssistantSummary], as_json: bool) -> None:
    for one in found:
        if as_json:
            print(json.dumps({"name": one.name, "agent": one.agent, "version": one.version}))
        else:
            print(f"{one.name}\tv{one.version}\t{one.agent}")


def _print_changes(changes: list[FieldChange], as_json: bool) -> None:
    for change in changes:
        if as_json:
            print(change.model_dump_json())
        else:
            print(f"{change.field}: {json.dumps(change.before)} -> {json.dumps(change.after)}")
