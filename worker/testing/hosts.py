"""Simulated hosts on one machine: network namespaces on a bridge, each with its own processes.

    with HostNetwork() as net:
        host = net.add_host()
        proc = subprocess.Popen(host.wrap(["python", "-m", "producer.cli", "worker", ...]))

The root namespace holds a bridge with :attr:`HostNetwork.server_ip`; the servers (Redis, the
cluster's nodes, the broker) listen there. Each :class:`SimulatedHost` is a network namespace with
its own loopback and one veth pair into the bridge, so its processes reach the servers over a
real (virtual) link, with its own TCP stack, and not over loopback.

What this does not simulate: separate CPUs (every host shares the machine's cores, so adding hosts
adds network paths and processes, not computing power), nor a network's latency (a veth pair
costs microseconds; ``netem`` would add more, where the kernel has it). Needs root and ``ip``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from worker.testing.harness import WorkerProcess

__all__ = ["HostNetwork", "SimulatedHost", "available"]


def available() -> str | None:
    """Why simulated hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "ip (iproute2) is not installed"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


@dataclass
class SimulatedHost:
    """One network namespace on the bridge: its name, its address, and how to run in it."""

    netns: str
    ip: str

    def wrap(self, args: list[str]) -> list[str]:
        """The command line that runs ``args`` inside this host (``ip netns exec`` execs, so the pid
        is the program's own and signals reach it)."""
        return ["ip", "netns", "exec", self.netns, *args]

    def place(self, worker: WorkerProcess) -> WorkerProcess:
        """``worker``, set to start inside this host (before it is started)."""
        worker.args = self.wrap(worker.args)
        return worker


@dataclass
class HostNetwork:
    """A bridge with the servers' address, and the simulated hosts attached to it."""

    name: str = "wsc"
    subnet: str = "10.77.0"
    hosts: list[SimulatedHost] = field(default_factory=list)
    _up: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    @property
    def server_ip(self) -> str:
        """Where the servers listen (the bridge's address in the root namespace)."""
        return f"{self.subnet}.1"

    def start(self) -> HostNetwork:
        reason = available()
        if reason:
            raise RuntimeError(f"simulated hosts are not available: {reason}")
        self._remove_leftovers()
        _ip("link", "add", self.bridge, "type", "bridge")
        self._up = True
        _ip("addr", "add", f"{self.server_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add_host(self) -> SimulatedHost:
        index = len(self.hosts) + 1
        netns, outside, inside = f"{self.name}-h{index}", f"{self.name}-h{index}a", f"{self.name}-h{index}b"
        host = SimulatedHost(netns=netns, ip=f"{self.subnet}.{10 + index}")
        _ip("netns", "add", netns)
        self.hosts.append(host)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("addr", "add", f"{host.ip}/24", "dev", inside, netns=netns)
        _ip("link", "set", inside, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        return host

    def close(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
        self.hosts.clear()
        if self._up:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
            self._up = False

    def _remove_leftovers(self) -> None:
        """Namespaces and the bridge of an earlier run that died before it could clean up."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
        for line in listed.stdout.splitlines():
            netns = line.split()[0] if line.strip() else ""
            if netns.startswith(f"{self.name}-h"):
                subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
