"""A throwaway three-node Redis Cluster on loopback: three ``redis-server --cluster-enabled yes``
children on free ports, joined by ``redis-cli --cluster create`` (masters only, the 16,384 hash
slots split between them), stopped by their PIDs. The Redis Cluster tier tests and the store
benchmark start theirs with ``LocalRedisCluster``."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from blendrag_servers.redis_server import REDIS_BINARY, RedisUnavailable, free_port

REDIS_CLI = shutil.which("redis-cli")


class LocalRedisCluster:
    """Three cluster-mode ``redis-server`` processes on 127.0.0.1; ``url`` names the first node
    (a cluster client discovers the others from it)."""

    NODES = 3

    def __init__(self, timeout_s: float = 30.0) -> None:
        if REDIS_BINARY is None or REDIS_CLI is None:
            raise RedisUnavailable("no redis-server/redis-cli on PATH (apt-get install "
                                   "redis-server)")
        self._tmp = tempfile.TemporaryDirectory(prefix="blendrag-redis-cluster-")
        self.ports = [free_port() for _ in range(self.NODES)]
        self._procs = [self._start(port, free_port()) for port in self.ports]
        self.url = f"redis://127.0.0.1:{self.ports[0]}"
        try:
            self._create(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, port: int, bus_port: int) -> subprocess.Popen:
        directory = Path(self._tmp.name) / str(port)
        directory.mkdir()
        # the bus port is given: its default, port + 10000, is out of range above 55535
        return subprocess.Popen(
            [str(REDIS_BINARY), "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(bus_port),
             "--cluster-config-file", "nodes.conf",
             "--save", "", "--appendonly", "no", "--dir", str(directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _create(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for port in self.ports:  # every node answers before the cluster is formed
            while subprocess.run([str(REDIS_CLI), "-p", str(port), "ping"],
                                 capture_output=True, text=True).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    raise RedisUnavailable(f"redis-server on port {port} did not start")
                time.sleep(0.05)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        made = subprocess.run([str(REDIS_CLI), "--cluster", "create", *nodes,
                               "--cluster-replicas", "0", "--cluster-yes"],
                              capture_output=True, text=True, timeout=timeout_s)
        if made.returncode != 0:
            raise RedisUnavailable(f"redis-cli --cluster create failed: {made.stdout[-300:]}")
        while "cluster_state:ok" not in subprocess.run(
                [str(REDIS_CLI), "-p", str(self.ports[0]), "cluster", "info"],
                capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                raise RedisUnavailable("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    def node_urls(self) -> list[str]:
        """One URL per node (a plain client of one node sees only its own keys)."""
        return [f"redis://127.0.0.1:{p}" for p in self.ports]

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._tmp.cleanup()

    def __enter__(self) -> LocalRedisCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
