"""A real Redis Cluster on loopback ports, for the tests and the benchmarks.

:class:`RedisCluster` starts ``masters`` primaries and ``replicas`` replicas of each (plain
``redis-server`` processes with ``--cluster-enabled yes``), joins them with ``redis-cli --cluster
create`` and waits until every node reports ``cluster_state:ok`` and every replica is in sync.
A test can SIGKILL the primary that owns a key's slot and wait for its replica to be promoted.

:class:`ClusterStore` is what a test gets where it would get a :class:`~worker.testing.harness.RedisServer`
when the session runs with ``--store cluster``: the cluster holds the run state, a standalone
``redis-server`` of the test's own is the broker (Celery's Redis transport has no cluster support).
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster as ClusterClient

from worker.testing.brokers import drop_broker_for, register_cluster, unregister_cluster
from worker.testing.harness import RedisServer, wait_until

__all__ = [
    "NODE_TIMEOUT_MS",
    "ClusterNode",
    "ClusterStore",
    "RedisCluster",
    "broker_redis",
    "free_cluster_port",
]

#: How long a primary may be unreachable before the others fail it over (ms): short, so a killed
#: primary's replica takes over within a few seconds, long enough that a loaded machine's stalls
#: do not fail nodes over by themselves.
NODE_TIMEOUT_MS = 2000


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 above it) is free too.

    Redis's cluster bus listens at ``port + 10000``, so the port must be at most 55535; the
    kernel's ephemeral ports are above that, hence a search of our own.
    """
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free pair of loopback ports for a cluster node")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ClusterNode:
    """One ``redis-server`` of the cluster."""

    def __init__(self, binary: str, root: Path, *, appendonly: bool, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_cluster_port()
        self.dir = root / str(self.port)
        self.dir.mkdir()
        self.binary = binary
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> ClusterNode:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--cluster-enabled",
            "yes",
            # Off only on a simulated hosts' bridge, which nothing outside this machine reaches.
            "--protected-mode",
            "yes" if self.host == "127.0.0.1" else "no",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--loglevel",
            "warning",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        wait_until(
            lambda: _pings(client), timeout=10, what=f"cluster node {self.address} to accept connections"
        )
        client.close()
        return self

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client of this node alone (for its INFO and CLUSTER commands)."""
        return redis.Redis(host=self.host, port=self.port, decode_responses=True, **kwargs)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last write to disk, no goodbye to the other nodes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def cluster_ok(self) -> bool:
        client = self.client(socket_timeout=5)
        try:
            return dict(client.cluster("INFO")).get("cluster_state") == "ok"
        finally:
            client.close()

    def info(self, section: str) -> dict[str, Any]:
        client = self.client(socket_timeout=5)
        try:
            return dict(client.info(section))
        finally:
            client.close()


class RedisCluster:
    """``masters`` primaries with ``replicas`` replicas each, on free loopback ports."""

    def __init__(
        self, masters: int = 3, replicas: int = 1, *, appendonly: bool = False, host: str = "127.0.0.1"
    ) -> None:
        """``host``: the address every node listens on and announces (another than loopback lets
        clients in other network namespaces reach the cluster, as in ``benchmarks/scale.py``)."""
        binary = shutil.which("redis-server")
        if binary is None or shutil.which("redis-cli") is None:
            raise RuntimeError(
                "redis-server and redis-cli must be on PATH (Debian: apt-get install redis-server)"
            )
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one primary")
        self.masters = masters
        self.replicas = replicas
        self.root = Path(tempfile.mkdtemp(prefix="wesichain-cluster-"))
        self.nodes = [
            ClusterNode(binary, self.root, appendonly=appendonly, host=host)
            for _ in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        """The URL of the first node: the cluster client learns every other node from it."""
        return f"redis://{self.nodes[0].address}/0"

    def start(self, timeout: float = 90) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            if self.masters < 3:
                self._create_small()  # redis-cli wants three primaries at least
            else:
                self._create()
            wait_until(self.healthy, timeout=timeout, interval=0.1, what="the cluster to be ok and in sync")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _create(self) -> None:
        args = ["redis-cli", "--cluster", "create", *(n.address for n in self.nodes)]
        args += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")

    def _create_small(self) -> None:
        """One or two primaries (redis-cli wants three): slots split by hand, replicas attached."""
        primaries = self.nodes[: self.masters]
        share = 16384 // self.masters
        for i, node in enumerate(primaries):
            end = 16383 if i == self.masters - 1 else (i + 1) * share - 1
            client = node.client()
            client.execute_command("CLUSTER ADDSLOTSRANGE", i * share, end)  # type: ignore[no-untyped-call]
            client.close()
        first = primaries[0]
        for node in self.nodes[1:]:
            client = node.client()
            client.execute_command("CLUSTER MEET", first.host, first.port)  # type: ignore[no-untyped-call]
            client.close()
        wait_until(
            lambda: self._known_to_all(), timeout=30, interval=0.1, what="every node to know every other"
        )
        for i, node in enumerate(self.nodes[self.masters :]):
            primary = primaries[i % self.masters]
            node_id = primary.client().execute_command("CLUSTER MYID")  # type: ignore[no-untyped-call]
            client = node.client()
            # Every node knows every other now.
            client.execute_command("CLUSTER REPLICATE", node_id)  # type: ignore[no-untyped-call]
            client.close()

    def _known_to_all(self) -> bool:
        for node in self.nodes:
            reply = node.client().execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]
            text = reply if isinstance(reply, str) else "\n".join(str(line) for line in reply)
            if len([line for line in text.splitlines() if line.strip()]) < len(self.nodes):
                return False
        return True

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok``, every live primary's slots are covered and every
        replica of a live primary has its link up and caught up."""
        try:
            for node in self.live_nodes():
                if not node.cluster_ok():
                    return False
                replication = node.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False
                if replication.get("role") == "master" and int(replication.get("connected_slaves", 0)) < len(
                    self._replicas_of(node)
                ):
                    return False
        except redis.RedisError:
            return False
        return True

    def live_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.alive]

    def _replicas_of(self, primary: ClusterNode) -> list[ClusterNode]:
        return [n for n in self.live_nodes() if n is not primary and self.primary_of_replica(n) is primary]

    def primary_of_replica(self, node: ClusterNode) -> ClusterNode | None:
        replication = node.info("replication")
        if replication.get("role") != "slave":
            return None
        port = int(replication.get("master_port", 0))
        return next((n for n in self.nodes if n.port == port), None)

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.live_nodes() if n.info("replication").get("role") == "master"]

    def owner(self, key: str) -> ClusterNode:
        """The live primary serving ``key``'s slot now."""
        client = self.client()
        try:
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return next(n for n in self.nodes if n.port == int(node.port))
        finally:
            client.close()

    def client(self, **kwargs: Any) -> ClusterClient:
        return ClusterClient.from_url(
            self.url if self.nodes[0].alive else self._live_url(), decode_responses=True, **kwargs
        )

    def _live_url(self) -> str:
        return f"redis://{self.live_nodes()[0].address}/0"

    def kill_primary_of(
        self, key: str, timeout: float = 60, *, in_sync: bool = True
    ) -> tuple[ClusterNode, ClusterNode]:
        """SIGKILL the primary of ``key``'s slot and wait until a replica serves the slot.

        ``in_sync``: first wait until its replicas have everything it had written (replication is
        asynchronous: without it, writes of the last moments may be lost with the primary).

        Returns (the killed primary, the promoted replica).
        """
        victim = self.owner(key)
        replicas = self._replicas_of(victim)
        if not replicas:
            raise RuntimeError(f"{victim.address} has no replica to take over")
        if in_sync:
            offset = int(victim.info("replication")["master_repl_offset"])
            wait_until(
                lambda: all(
                    int(n.info("replication").get("slave_repl_offset", -1)) >= offset for n in replicas
                ),
                timeout=timeout,
                interval=0.05,
                what="the replicas to catch up before the kill",
            )
        victim.kill()

        def promoted() -> ClusterNode | None:
            for node in replicas:
                try:
                    if node.info("replication").get("role") == "master":
                        return node
                except redis.RedisError:
                    continue
            return None

        heir: ClusterNode = wait_until(
            promoted, timeout=timeout, interval=0.1, what="a replica to be promoted"
        )
        wait_until(self._ok_everywhere, timeout=timeout, interval=0.1, what="the cluster to be ok again")
        return victim, heir

    def _ok_everywhere(self) -> bool:
        try:
            return all(n.cluster_ok() for n in self.live_nodes())
        except redis.RedisError:
            return False

    def flush(self) -> None:
        """Empty every primary (their replicas follow)."""
        for node in self.primaries():
            client = node.client()
            client.flushall()
            client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class ClusterStore(RedisServer):
    """A test's run state on a (shared) :class:`RedisCluster`, its broker a redis-server of its own.

    It stands where a :class:`RedisServer` would: ``url`` is the run state's URL (the cluster's
    first node, with ``WESICHAIN_REDIS_CLUSTER=1`` given by ``tests/broker.py``), ``client()`` a
    cluster client. Restarting or stopping "the" Redis has no meaning here: those tests are
    marked ``standalone_redis`` and skipped.
    """

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self.broker = RedisServer()
        self.port = cluster.nodes[0].port
        self.dir = str(cluster.root)
        self.appendonly = False
        self.tls = None
        self.proc = None

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> ClusterStore:
        self.broker.start()
        register_cluster(self.url, self.broker.url)
        return self

    def client(self, **kwargs: Any) -> redis.Redis:
        if kwargs.get("db", 0) == 0:
            kwargs.pop("db", None)  # a cluster has database 0 only, and its client takes no db
        return self.cluster.client(**kwargs)  # type: ignore[return-value]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        raise NotImplementedError("the run state is a Redis Cluster: mark the test standalone_redis")

    def restart(self) -> None:
        raise NotImplementedError("the run state is a Redis Cluster: mark the test standalone_redis")

    def cleanup(self) -> None:
        unregister_cluster(self.url)
        drop_broker_for(self.url)
        self.broker.cleanup()
        self.cluster.flush()


def broker_redis(server: RedisServer) -> redis.Redis:
    """A client of the Redis that holds ``server``'s broker queues: the server itself, or the
    standalone broker of a :class:`ClusterStore`."""
    if isinstance(server, ClusterStore):
        return server.broker.client()
    return server.client()
