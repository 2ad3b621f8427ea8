"""A throwaway ``redis-server`` on a free loopback port, for the store benchmark's Redis tier."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time


REDIS_BINARY = shutil.which("redis-server")


class RedisUnavailable(RuntimeError):
    """No Redis tier can be measured here; the message says why."""


class LocalRedis:
    """``redis-server`` on 127.0.0.1, no persistence, stopped by ``stop()`` or on leaving ``with``."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        binary = REDIS_BINARY
        if binary is None:
            raise RedisUnavailable("no redis-server binary on PATH (apt-get install redis-server)")
        try:
            import redis
        except ImportError:
            raise RedisUnavailable("redis-py is not installed (pip install 'blendrag[redis]')") from None
        self._workdir = tempfile.TemporaryDirectory(prefix="blendrag-redis-")
        port = _free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        self._proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._workdir.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis.from_url(self.url)
        self._wait(redis, timeout_s)

    def _wait(self, redis, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RedisUnavailable("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.client.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        self._workdir.cleanup()

    def __enter__(self) -> "LocalRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
