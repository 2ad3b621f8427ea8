"""A single-node Ray cluster on 127.0.0.1 for the tests that run Ray (``pytest.importorskip``
first: ray is the ``blendrag[ray]`` extra)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# Ray's own switch that keeps a single-node cluster on the loopback interface; without it Ray
# listens on every interface and advertises the machine's address. Ray reads it as it is
# imported: import_ray sets it first (the test processes only; the library never reads it).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray():
    """The ray module (the loopback switch set before it is imported), or the test skipped
    with the reason."""
    os.environ[LOOPBACK_ENV] = "0"
    reason = "ray[data] is not installed (pip install 'blendrag[ray]') - Ray jobs untested"
    ray = pytest.importorskip("ray", reason=reason)
    pytest.importorskip("ray.data", reason=reason)
    return ray


@contextmanager
def local_cluster(num_cpus: int = 2) -> Iterator[str]:
    """Start a cluster of ``num_cpus`` CPUs on 127.0.0.1; its GCS address; shut down after."""
    ray = import_ray()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        addresses = {n["NodeManagerAddress"] for n in ray.nodes()}
        assert addresses == {"127.0.0.1"}, ("the test cluster is not on loopback (was ray "
                                            f"imported before import_ray?): {addresses}")
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
