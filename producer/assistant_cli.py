"""``wesichain assistants create|update|show|ls|diff|rollback``, straight to Redis."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from producer.client import Client
from shared.assistants import AssistantVersion
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


def run_assistants(args: argparse.Namespace) -> int:
    assistants = Client.from_env().assistants
    tenant, as_json = args.tenant, args.json
    command = args.assistants_command
    if command == "create":
        _print_version(assistants.create(args.name, args.agent, _config(args.config), tenant=tenant), as_json)
    elif command == "update":
        updated = assistants.update(
            args.name, _config(args.config), tenant=tenant, if_version=args.if_version
        )
        _print_version(updated, as_json)
    elif command == "rollback":
        _print_version(assistants.rollback(args.name, args.version, tenant=tenant), as_json)
    elif command == "show" and args.versions:
        for version in assistants.versions(args.name, tenant=tenant, limit=500):
            _print_version(version, as_json)
    elif command == "show":
        _print_version(assistants.get(args.name, version=args.version, tenant=tenant), as_json)
    elif command == "ls":
        for found in assistants.list(tenant=tenant, limit=500):
            if as_json:
                print(json.dumps({"name": found.name, "agent": found.agent, "version": found.version}))
            else:
                print(f"{found.name}\tv{found.version}\t{found.agent}")
    elif command == "diff":
        for change in assistants.diff(args.name, args.before, args.after, tenant=tenant):
            if as_json:
                print(change.model_dump_json())
            else:
                print(f"{change.field}: {json.dumps(change.before)} -> {json.dumps(change.after)}")
    return 0
