"""A RabbitMQ node of a test's own, so that the test can kill and restart it freely, as
:class:`tests.harness.RedisServer` does for Redis.

``rabbitmq-server`` (Debian's package) runs as the current user on free loopback ports, its node
name, data, logs and Erlang cookie in a temporary directory: the machine's own RabbitMQ node and
its configuration are not touched. The node has its default virtual host ``/`` and user ``guest``
(which RabbitMQ admits from loopback only). A restart keeps the ports and the data, so durable
(quorum) queues and the messages they confirmed come back with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import amqp

from tests.harness import free_port, wait_until

#: The server script itself: /usr/sbin/rabbitmq-server is a wrapper that, run as root, switches to
#: the package's user and its data directory.
_SERVER_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/lib/rabbitmq/sbin/rabbitmq-server")


def server_script() -> str | None:
    for path in _SERVER_SCRIPTS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("rabbitmq-server")


class RabbitMQNode:
    def __init__(self) -> None:
        script = server_script()
        if script is None:
            raise RuntimeError("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)")
        self.script = script
        self.port = free_port()
        self.dist_port = free_port()
        self.name = f"wesichain-test-{self.port}@localhost"
        self.dir = Path(tempfile.mkdtemp(prefix="wesichain-rabbitmq-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        home = self.dir / "home"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),  # the node's Erlang cookie is made there
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            # No file there: the machine's /etc/rabbitmq configuration stays out of the test.
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
        }

    def start(self, timeout: float = 120) -> RabbitMQNode:
        log = open(self.dir / "server.out", "ab")  # the child holds its own copy: closed below
        try:
            self.proc = subprocess.Popen(
                [self.script],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its Erlang VM and helpers die with it as a group
            )
        finally:
            log.close()
        what = f"RabbitMQ node {self.name} to accept AMQP"
        wait_until(self._serving, timeout=timeout, interval=0.2, what=what)
        return self

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.output()[-3000:]
            raise RuntimeError(f"rabbitmq-server exited with {self.proc.returncode}:\n{tail}")
        connection = amqp.Connection(host=f"127.0.0.1:{self.port}", connect_timeout=2)
        try:
            connection.connect()
        except (OSError, amqp.exceptions.AMQPError):
            return False
        finally:
            try:
                connection.close()
            except (OSError, amqp.exceptions.AMQPError):
                pass
        return True

    def output(self) -> str:
        path = self.dir / "server.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the node's whole process group: a crash, nothing flushed on the way out."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
