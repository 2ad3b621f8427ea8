"""A throwaway ``redis-server`` child process on a free loopback port: the store benchmark's Redis
tier and the Redis tier tests both start theirs with ``LocalRedis``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REDIS_BINARY = shutil.which("redis-server")


class RedisUnavailable(RuntimeError):
    """No local Redis server can be started here; the message says why."""


class LocalRedis:
    """``redis-server`` on 127.0.0.1, no persistence, stopped by ``stop()`` or on leaving ``with``.

    ``workdir``: the server's working directory (default: a temporary one, removed on stop)."""

    def __init__(self, workdir: str | Path | None = None, timeout_s: float = 10.0) -> None:
        if REDIS_BINARY is None:
            raise RedisUnavailable("no redis-server binary on PATH (apt-get install redis-server)")
        try:
            import redis
        except ImportError:
            raise RedisUnavailable(
                "redis-py is not installed (pip install 'blendrag[redis]')"
            ) from None
        self._tmp = (
            tempfile.TemporaryDirectory(prefix="blendrag-redis-") if workdir is None else None
        )
        directory = self._tmp.name if self._tmp is not None else str(workdir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc = subprocess.Popen(
            [REDIS_BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no",
             "--dir", directory],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(redis, timeout_s)

    def _wait(self, redis, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            client = self.client()
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RedisUnavailable("redis-server did not start") from None
                time.sleep(0.05)
            finally:
                client.close()

    def client(self):
        """A new ``redis.Redis`` client of this server (close it when done)."""
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> LocalRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
