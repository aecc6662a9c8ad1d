"""The HTTP schedules clients' methods are made from one definition per operation; they must still
show their real arguments to ``help()``, editors and ``inspect.signature``."""

from __future__ import annotations

import inspect

import pytest

from producer.api_schedules import ApiSchedules, AsyncSchedules
from producer.schedules import Schedules


@pytest.mark.parametrize("client", [ApiSchedules, AsyncSchedules])
@pytest.mark.parametrize(
    "name", ["create", "update", "get", "list", "pause", "resume", "delete", "next_fire_times", "runs"]
)
def test_a_made_method_shows_the_arguments_of_its_operation(client: type, name: str) -> None:
    method = getattr(client, name)
    assert method.__name__ == name
    params = list(inspect.signature(method).parameters)
    assert params[0] == "self"
    # The tenant and the models it may name are the key's over HTTP, never arguments of a request.
    own = ("tenant", "allowed_models")
    local = [p for p in inspect.signature(getattr(Schedules, name)).parameters if p not in own]
    assert params == local
