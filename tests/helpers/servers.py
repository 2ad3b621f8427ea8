"""The local servers some tests need - ``redis-server`` (one server or a three-node cluster)
and Ceph RGW for S3 - started or, where this machine cannot start them, the test skipped with
the reason (what is missing and how to install it). Every test that needs a server gets it
through one of these, so that ``make test`` passes on a machine without them."""

from __future__ import annotations

from pathlib import Path

import pytest


def redis_or_skip(workdir: str | Path | None = None):
    """A ``LocalRedis`` in ``workdir``, or the test skipped saying why none can start here."""
    from blendrag_servers.redis_server import LocalRedis, RedisUnavailable

    try:
        return LocalRedis(workdir)
    except RedisUnavailable as exc:
        pytest.skip(f"no local Redis server: {exc} - Redis tier untested")


def redis_cluster_or_skip():
    """A ``LocalRedisCluster``, or the test skipped saying why none can start here."""
    from blendrag_servers.redis_cluster import LocalRedisCluster
    from blendrag_servers.redis_server import RedisUnavailable

    try:
        return LocalRedisCluster()
    except RedisUnavailable as exc:
        pytest.skip(f"no local Redis Cluster: {exc} - Redis Cluster tier untested")


def s3_or_skip():
    """A ``LocalS3`` (Ceph RGW), or the test skipped saying why none can start here."""
    pytest.importorskip("boto3", reason="boto3 not installed (pip install 'blendrag[s3]')")
    from blendrag_servers.s3_server import LocalS3, S3Unavailable

    try:
        return LocalS3()
    except S3Unavailable as exc:
        pytest.skip(f"no local S3 server: {exc} - S3 tier untested")
