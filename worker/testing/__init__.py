"""Real processes for testing agents and the runtime: a ``redis-server`` on a free port, ``wesichain
worker`` and ``wesichain api`` processes in their own process groups, a Redis Cluster, simulated
hosts, fault-injection hooks.

The runtime's own tests and benchmarks use them, as a project's tests may. Nothing is mocked: they
need the ``redis-server`` binary, and ``psutil`` (the ``testing`` extra:
``pip install 'wesichain[testing]'``).

* :mod:`worker.testing.harness`: :class:`RedisServer`, :class:`WorkerProcess`, :func:`wait_until`;
* :mod:`worker.testing.brokers`: which broker each server's processes use;
* :mod:`worker.testing.cluster`: a Redis Cluster on loopback ports;
* :mod:`worker.testing.api`: a ``wesichain api`` process;
* :mod:`worker.testing.hosts`: simulated hosts (network namespaces; root);
* :mod:`worker.testing.faults`: hooks that crash or pause workers at chosen points;
* :mod:`worker.testing.runs`: runs taken through real claims and commits, straight on a store.
"""

from __future__ import annotations

from worker.testing.harness import (
    ROOT,
    PortTaken,
    RedisServer,
    ServerTls,
    WorkerProcess,
    free_port,
    running,
    start_all,
    stop_all,
    wait_until,
)

__all__ = [
    "ROOT",
    "PortTaken",
    "RedisServer",
    "ServerTls",
    "WorkerProcess",
    "free_port",
    "running",
    "start_all",
    "stop_all",
    "wait_until",
]
