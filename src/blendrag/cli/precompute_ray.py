"""`blendrag precompute --ray [ADDRESS] --actors N [--gpus-per-actor G]`: the same job on a Ray
cluster (``blendrag.distributed.ray``), with the same summary.

Without an address the job starts a single-node cluster of its own, on 127.0.0.1 only, and
stops it at the end. A multi-node job needs a shared tier: each node would write its own
``--store-dir``, so the actors then write into ``--redis-url`` / ``--s3-url`` alone (without
either the job is refused).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blendrag.cli.options import engine_spec, engine_threads

if TYPE_CHECKING:
    from blendrag.distributed.ray import RayResult
    from blendrag.ingest.sources import ChunkSource
    from blendrag.store.config import StoreConfig

LOCAL = "local"
# Ray's own switch that keeps a single-node cluster on the loopback interface (else it
# listens on every interface and advertises the machine's address).
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def add_ray_options(p: argparse.ArgumentParser) -> None:
    """--ray [ADDRESS], --actors, --gpus-per-actor."""
    g = p.add_argument_group("Ray cluster (pip install blendrag[ray]; docs/scale.md)")
    g.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                   help="run the job on Ray actors: the cluster at ADDRESS (auto, HOST:6379, "
                        "ray://HOST:10001), or without one a local single-node cluster on "
                        "127.0.0.1 (default: no Ray, this process)")
    g.add_argument("--actors", type=int, default=1, metavar="N",
                   help="with --ray: actors computing side by side, each loading the model once "
                        "(default: 1)")
    g.add_argument("--gpus-per-actor", type=float, default=0.0, metavar="G",
                   help="with --ray: GPUs each actor holds; the job is refused at once when the "
                        "cluster has fewer than N x G (default: 0, CPU only)")


def check_ray_args(args: argparse.Namespace) -> None:
    """ValueError for Ray options that cannot work, before anything starts."""
    if args.ray is None:
        if args.actors != 1 or args.gpus_per_actor:
            raise ValueError("--actors and --gpus-per-actor apply to --ray jobs only")
        return
    if args.actors < 1:
        raise ValueError(f"--actors must be >= 1, got {args.actors}")
    if args.gpus_per_actor < 0:
        raise ValueError(f"--gpus-per-actor must be >= 0, got {args.gpus_per_actor}")
    if args.profile_neighbours:
        raise ValueError("--profile-neighbours needs the chunks in document order across "
                         "batches, which Ray's actors do not keep: measure profiles in a local "
                         "job (without --ray)")


def run_ray(args: argparse.Namespace, source: ChunkSource, config: StoreConfig) -> RayResult:
    """Connect (or start a local cluster), precompute ``source`` on the actors, disconnect."""
    from blendrag.distributed.ray import RayJob, alive_nodes, precompute_texts
    from blendrag.distributed.settings import IngestSettings

    check_ray_args(args)
    job = RayJob(actors=args.actors, gpus_per_actor=args.gpus_per_actor)
    texts = list(source)
    ray, connected = connect(args.ray)
    try:
        if args.no_progress:
            ray.data.DataContext.get_current().enable_progress_bars = False
        store = shared_store(config, alive_nodes())
        # each worker sets its own threads: the driver's ``apply_threads`` does not reach it
        spec = replace(engine_spec(args, chat=args.chat, system=args.system),
                       threads=engine_threads(args))
        settings = IngestSettings.of(spec, chunk_prefix=args.chunk_prefix, prefix=args.prefix,
                                     store=store, text_index=_text_index(args, store),
                                     batch_size=args.batch_size)
        return precompute_texts(texts, settings, job, progress=not args.no_progress)
    finally:
        if connected:
            ray.shutdown()


def _text_index(args: argparse.Namespace, store: StoreConfig) -> Path | None:
    """--text-index, else for chunks made for the framework LLMs (--chunk-prefix) the store's
    own text index, where those LLMs look (as the local job records them); none on several
    nodes (a store folder there is one per node)."""
    from blendrag.integration.default_index import index_folder

    if args.text_index is not None or args.chunk_prefix is None:
        return args.text_index
    return index_folder(store)


def shared_store(config: StoreConfig, nodes: int) -> StoreConfig:
    """The store the actors write into: ``config`` on one node; on several, its shared tiers
    alone (Redis, S3: a store folder would be one folder per node), or ValueError without
    one."""
    from blendrag.distributed.settings import shared_tiers

    if nodes <= 1:
        return config
    tiers = shared_tiers(config)
    if not tiers:
        raise ValueError(f"the Ray cluster has {nodes} nodes: each would write its own "
                         "--store-dir. Give the job a shared tier: --redis-url or --s3-url")
    print(f"blendrag precompute: {nodes} nodes: the actors write into the {' and '.join(tiers)} "
          "tier only (not --store-dir, which would be one folder per node)", file=sys.stderr)
    return replace(config, ram_bytes=0, disk_dir=None)


def connect(address: str, num_cpus: int | None = None) -> tuple[Any, bool]:
    """The ray module, connected to ``address`` or (``LOCAL``) to a single-node cluster started
    now on 127.0.0.1; and whether this call connected (False: the process was connected
    already, as a program calling the CLI's ``main`` on its own cluster is, and stays so).
    ``num_cpus``: the local cluster's CPUs (None: one per core)."""
    from blendrag.distributed.ray import require_ray

    # Ray reads the loopback switch as it is imported, and its processes as they start.
    with _env(_LOOPBACK_ENV, "0") if address == LOCAL else contextlib.nullcontext():
        ray = require_ray()
        if ray.is_initialized():
            return ray, False
        if address == LOCAL:
            ray.init(address="local", include_dashboard=False, num_cpus=num_cpus)
        else:
            ray.init(address=address)
    return ray, True


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment for the block (Ray reads it as it starts
    the cluster's processes), then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
