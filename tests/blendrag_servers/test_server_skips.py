"""A machine without redis-server or Ceph: every test that needs one of those servers is
skipped with the reason (what is missing, how to install it), never an error, so that
``make test`` passes there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.servers import redis_cluster_or_skip, redis_or_skip, s3_or_skip

ROOT = Path(__file__).resolve().parents[2]
# every module whose tests start a local server, through a fixture or one of their own
SERVER_MODULES = [
    "tests/blendrag/store/test_redis.py",
    "tests/blendrag/store/test_redis_faults.py",
    "tests/blendrag/store/test_shared_tiers.py",
]


def test_no_redis_server_skips_with_the_reason(monkeypatch, tmp_path):
    import blendrag_servers.redis_server as redis_server

    monkeypatch.setattr(redis_server, "REDIS_BINARY", None)
    with pytest.raises(pytest.skip.Exception, match=r"no local Redis server: no redis-server "
                                                    r"binary on PATH \(apt-get install"):
        redis_or_skip(tmp_path)


def test_no_redis_cluster_skips_with_the_reason(monkeypatch):
    import blendrag_servers.redis_cluster as redis_cluster

    monkeypatch.setattr(redis_cluster, "REDIS_BINARY", None)
    with pytest.raises(pytest.skip.Exception, match=r"no local Redis Cluster: no redis-server"):
        redis_cluster_or_skip()


def test_no_ceph_skips_with_the_reason(monkeypatch, tmp_path):
    pytest.importorskip("boto3", reason="boto3 not installed (pip install 'blendrag[s3]')")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no Ceph binary on it
    with pytest.raises(pytest.skip.Exception, match=r"no local S3 server: ceph-authtool, .*"
                                                    r"radosgw-admin not on PATH"):
        s3_or_skip()


@pytest.mark.processes
def test_the_server_tests_skip_on_a_path_without_the_servers(tmp_path):
    """The server tests as ``make test`` runs them, with a PATH on which neither redis-server
    nor Ceph can be found: no error, and every skip says what is missing."""
    empty = tmp_path / "bin"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *SERVER_MODULES],
        cwd=ROOT, env={"PATH": str(empty), "HOME": str(tmp_path / "home"),
                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "COLUMNS": "500"},  # skip reasons printed whole
        capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert not re.search(r"\d+ error", out), out[-3000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped, out[-3000:]
    assert all("on PATH" in line and "apt-get install" in line for line in skipped), skipped
    assert int(re.search(r"(\d+) skipped", out).group(1)) >= 20
