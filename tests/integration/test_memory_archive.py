"""Long-term memory in the run archive (SQLite and a scratch PostgreSQL database), on a real
redis-server: an archiver pass copies a tenant's items, copies only what changed, keeps an item
that expired in Redis (readable from the archive after) and removes one that was deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.client import Client
from shared.archive import open_archive
from shared.archiver import Archiver
from shared.keys import Keys
from shared.memory_archive import export_memory
from shared.tenants import Tenants
from tests.archive_support import BACKENDS, archive_url
from tests.broker import Settings
from tests.harness import RedisServer, wait_until


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.cleanup()


#: Seconds the expiring item lives.
SHORT_TTL_S = 5.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_follows_redis_into_the_archive(backend: str, server: RedisServer, tmp_path: Path) -> None:
    with archive_url(backend, tmp_path) as url:
        settings = Settings(redis_url=server.url, prefix=f"t-{uuid.uuid4().hex[:8]}:", archive_url=url)
        client = Client(settings)
        tenant, other = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
        tenants = Tenants(client.store.redis, Keys(settings.prefix))
        tenants.create_key(tenant, "t")
        tenants.create_key(other, "t")
        mine = client.memory_for(tenant)
        mine.put(["users", "u1"], "kept", {"text": "stays"})
        mine.put(["users", "u1"], "gone", {"text": "deleted later"})
        # Its life spans the first pass on a loaded machine (Redis's clock runs it, which no test stops).
        mine.put(["users", "u2"], "short", {"text": "expires"}, ttl_s=SHORT_TTL_S)
        client.memory_for(other).put(["users", "u1"], "theirs", {"text": "other tenant"})
        archiver = Archiver(client.store)

        first = archiver.run_once()
        assert (first.error, first.memory_copied, first.memory_removed) == ("", 4, 0)
        archive = open_archive(url)
        listed = archive.memory_items(tenant, ["users"])
        assert [(i.namespace, i.key) for i in listed] == [
            (["users", "u1"], "gone"),
            (["users", "u1"], "kept"),
            (["users", "u2"], "short"),
        ]
        assert [i.key for i in archive.memory_items(other)] == ["theirs"]
        assert archive.memory_items(tenant, ["users", "u2"])[0].value == {"text": "expires"}

        # Nothing changed: nothing is written again.
        assert archiver.run_once().memory_copied == 0
        mine.put(["users", "u1"], "kept", {"text": "changed"})
        assert mine.delete(["users", "u1"], "gone")
        wait_until(
            lambda: mine.get(["users", "u2"], "short") is None, SHORT_TTL_S + 30, what="the item to expire"
        )
        again = export_memory(mine, archive)
        assert (again.copied, again.unchanged, again.kept_expired, again.removed) == (1, 0, 1, 1)
        after = {i.key: i for i in archive.memory_items(tenant)}
        assert set(after) == {"kept", "short"}
        assert after["kept"].value == {"text": "changed"} and after["kept"].version == 2
        # The expired item is readable from the archive only.
        assert mine.get(["users", "u2"], "short") is None and after["short"].expires_at is not None
        # A prefix is matched by labels, not characters (u1 is not a prefix of u10).
        mine.put(["users", "u10"], "x", {"text": "x"})
        export_memory(mine, archive)
        assert [i.key for i in archive.memory_items(tenant, ["users", "u1"])] == ["kept"]
        archive.close()
        client.close()
