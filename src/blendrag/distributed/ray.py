"""Precompute a corpus on a Ray cluster (``pip install blendrag[ray]``).

A ``ray.data.Dataset`` of chunk texts (or LangChain Documents, LlamaIndex nodes) goes through
``map_batches`` on a pool of actors. Each actor builds its engine once from ``IngestSettings``
(the model loaded in the actor, the store opened there), writes the KVs it computes straight
into the shared tier and returns one small row per chunk (``shard.ROW_FIELDS``: key, tokens,
status); the driver only counts them into the local job's ``IngestSummary``. Resumable as the
local job: chunks already stored are skipped before any forward.

Before any actor starts, the cluster's resources are checked against what the actors ask for:
an actor asking for a GPU that no node has does not fail in Ray, it waits for one forever.
A multi-node job needs a shared tier: a store folder would be one folder per node.

>>> import ray
>>> from blendrag.distributed import IngestSettings
>>> from blendrag.distributed.ray import RayJob, precompute_dataset
>>> settings = IngestSettings(model="path/to/model", store=StoreConfig(
...     ram_bytes=0, disk_dir=None, redis_url="redis://10.0.0.5:6379/0"))
>>> result = precompute_dataset(ray.data.from_items(texts), settings, RayJob(actors=8,
...                             gpus_per_actor=1))
>>> print(result.summary.format())

docs/scale.md has the cluster set-up, what each actor needs and how to size the shared tier.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from blendrag.checks import check_at_least
from blendrag.distributed.settings import IngestSettings, shared_engine
from blendrag.distributed.shard import ROW_FIELDS, ingest_rows, summarize, text_of
from blendrag.ingest.job import IngestSummary

INSTALL = "pip install blendrag[ray]"


def require_ray() -> Any:
    """The ``ray`` module with Ray Data, or ImportError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data is an extra of ray itself)
    except ImportError as exc:
        raise ImportError(f"precomputing on Ray needs ray[data]: {INSTALL} ({exc})") from exc
    return ray


@dataclass(frozen=True)
class RayJob:
    """The actor pool of a Ray precompute.

    actors:          actors computing side by side (each loads the model once)
    gpus_per_actor:  GPUs each actor holds (0: CPU only; a fraction shares a GPU)
    cpus_per_actor:  CPUs each actor holds (its engine's torch threads should not exceed it)
    """

    actors: int = 1
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.actors, bool) or not isinstance(self.actors, int) or self.actors < 1:
            raise ValueError(f"RayJob.actors must be a count >= 1, got {self.actors!r}")
        for name in ("gpus_per_actor", "cpus_per_actor"):
            check_at_least(f"RayJob.{name}", getattr(self, name))


@dataclass(frozen=True)
class Steady:
    """The job after start-up: from when the last actor began its first batch (every actor
    started, its model loaded) to the end; the chunks and tokens of the batches begun since.
    (A batch begun just before is left out, its time not: the figures err low.)"""

    startup_s: float
    seconds: float
    computed: int
    tokens: int

    @property
    def chunks_per_s(self) -> float:
        return self.computed / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class RayResult:
    """What a Ray precompute did: the local job's summary (``seconds``: the whole job, start-up
    included), the job after its start-up (``steady``), the actors asked for and the alive
    nodes."""

    summary: IngestSummary
    steady: Steady
    actors: int
    nodes: int

    def to_dict(self) -> dict[str, Any]:
        st = self.steady
        return {**self.summary.to_dict(), "actors": self.actors, "nodes": self.nodes,
                "startup_s": st.startup_s, "chunks_per_s_after_startup": st.chunks_per_s,
                "tokens_per_s_after_startup": st.tokens_per_s}

    def format(self) -> str:
        st = self.steady
        return (f"{self.summary.format()}\nray: {self.actors} actors on {self.nodes} node(s); "
                f"start-up {st.startup_s:.1f} s, then {st.chunks_per_s:.1f} chunks/s, "
                f"{st.tokens_per_s:.0f} tokens/s")


def alive_nodes() -> int:
    """Alive nodes of the cluster this process is connected to."""
    return sum(1 for n in require_ray().nodes() if n.get("Alive"))


def check_cluster(settings: IngestSettings, job: RayJob) -> int:
    """ValueError when the cluster cannot run ``job`` (fewer GPUs or CPUs than the actors ask
    for; a store folder on several nodes); the count of alive nodes otherwise."""
    have = require_ray().cluster_resources()
    for what, each in (("GPU", job.gpus_per_actor), ("CPU", job.cpus_per_actor)):
        need, got = job.actors * each, float(have.get(what, 0.0))
        if need > got:
            raise ValueError(
                f"{job.actors} actors x {each:g} {what}s each need {need:g} {what}s, but the Ray "
                f"cluster has {got:g} (short by {need - got:g}): use fewer actors or "
                f"{what}s per actor" + (", or 0 GPUs per actor to run on CPUs"
                                        if what == "GPU" else "") + ", or add nodes")
    nodes = alive_nodes()
    if nodes > 1 and settings.store.disk_dir is not None:
        raise ValueError(f"the Ray cluster has {nodes} nodes: a store folder "
                         f"({settings.store.disk_dir}) would be one folder per node. Give the "
                         "actors a shared tier alone: StoreConfig(ram_bytes=0, disk_dir=None, "
                         "redis_url=... or s3_url=...)")
    return nodes


class ChunkActor:
    """A Ray Data actor: the engine built once from ``settings``; each batch ingested, one row
    per chunk returned (``shard.ROW_FIELDS``, and ``started`` and ``worker``: when the batch
    began, and on which actor)."""

    def __init__(self, settings: IngestSettings, column: str, index_column: str | None) -> None:
        self.settings, self.column, self.index_column = settings, column, index_column
        self.engine, self.text_index = shared_engine(settings)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        started = time.time()
        texts = [text_of(item) for item in batch[self.column]]
        indexes = ([int(i) for i in batch[self.index_column]] if self.index_column is not None
                   else None)
        rows = ingest_rows(self.engine, texts, prefix=self.settings.prefix, indexes=indexes,
                           text_index=self.text_index)
        if rows and rows[0]["text_index_error"]:  # reported in the rows; stop recording
            self.text_index = None
        out = {name: [r[name] for r in rows] for name in ROW_FIELDS}
        out["started"] = [started] * len(rows)
        out["worker"] = [self.worker] * len(rows)
        return out


def precompute_dataset(dataset: Any, settings: IngestSettings, job: RayJob | None = None, *,
                       column: str | None = None, progress: bool = True,
                       total: int | None = None) -> RayResult:
    """Precompute every chunk of ``dataset`` (a ``ray.data.Dataset``) on ``job``'s actors.

    ``column``: the column holding the chunks (default: ``text``, else ``item``, the column of
    ``ray.data.from_items(list)``); an ``index`` column, when present, numbers the failures.
    Connects to the cluster as Ray does when this process is not connected yet (``ray.init()``).
    ``progress``: a tqdm bar of the chunks done (``total``: their count, when known)."""
    ray = require_ray()
    job = job if job is not None else RayJob()
    if not ray.is_initialized():
        ray.init()
    nodes = check_cluster(settings, job)
    t0 = time.time()
    names = list(dataset.columns())
    column = column or ("text" if "text" in names else "item")
    if column not in names:
        raise ValueError(f"the dataset has no column {column!r}; its columns: {names}")
    mapped = dataset.map_batches(
        ChunkActor, fn_constructor_kwargs={"settings": settings, "column": column,
                                           "index_column": "index" if "index" in names else None},
        compute=ray.data.ActorPoolStrategy(size=job.actors), num_cpus=job.cpus_per_actor,
        num_gpus=job.gpus_per_actor, batch_size=settings.batch_size, batch_format="numpy")
    rows = _collect(mapped, progress, total)
    end = time.time()
    return RayResult(summarize(rows, end - t0), _steady(rows, t0, end), job.actors, nodes)


def precompute_texts(texts: Sequence[Any], settings: IngestSettings, job: RayJob | None = None,
                     *, progress: bool = True) -> RayResult:
    """``precompute_dataset`` of a list of chunks (texts, Documents or nodes), numbered in
    order."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init()
    dataset = ray.data.from_items([{"text": t, "index": i} for i, t in enumerate(texts)])
    return precompute_dataset(dataset, settings, job, column="text", progress=progress,
                              total=len(texts))


def _collect(mapped: Any, progress: bool, total: int | None) -> list[dict]:
    """Every row of the mapped dataset, as they stream in."""
    rows: list[dict] = []
    computed = 0
    names = (*ROW_FIELDS, "started", "worker")
    with tqdm(total=total, unit="chunk", desc="precompute (ray)", disable=not progress) as bar:
        for batch in mapped.iter_batches(batch_size=None, batch_format="numpy"):
            columns = {name: batch[name].tolist() for name in names}
            n = len(columns["status"])
            rows += [{name: columns[name][i] for name in names} for i in range(n)]
            computed += columns["status"].count("computed")
            bar.update(n)
            bar.set_postfix(computed=computed, refresh=False)
    return rows


def _steady(rows: list[dict], t0: float, end: float) -> Steady:
    """The job after every actor began computing (see ``Steady``)."""
    first: dict[str, float] = {}
    for r in rows:
        first[r["worker"]] = min(first.get(r["worker"], math.inf), r["started"])
    ready = max(first.values(), default=t0)
    done = [r for r in rows if r["started"] >= ready and r["status"] == "computed"]
    return Steady(startup_s=max(ready - t0, 0.0), seconds=max(end - ready, 0.0),
                  computed=len(done), tokens=sum(int(r["tokens"]) for r in done))
