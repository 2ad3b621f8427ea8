"""Precompute benchmark: the local job (one process) beside the Ray job (``--actors`` actors on
a local single-node cluster) on the same chunks, each into a fresh store of its own.

- local: ``ingest_source`` on one engine (``--threads`` torch threads, the model loaded before
  the clock starts), chunks/s and tokens/s over the whole job.
- ray: ``precompute_texts`` with each actor on ``--threads`` threads. The cluster's start and
  the job's start-up (the actors started, the model loaded in each: until the last actor
  began its first batch) are reported apart; its rates are those after start-up (the batches
  begun since, over the time from then to the end; ``distributed.ray.Steady``).

Chunks: distinct MuSiQue passages (shipped with the benchmarks) cut to ``--chunk-tokens``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blendrag.distributed import IngestSettings
from blendrag.ingest import ingest_source
from blendrag.store import StoreConfig

TARGET = 1.6  # Ray with 2 actors on 2 cores, after start-up, against one process on one thread


@dataclass(frozen=True)
class PrecomputeBenchConfig:
    """model: a model name or folder every actor loads; chunks of ``chunk_tokens`` tokens;
    ``actors`` Ray actors (0: the local job only); ``threads`` torch threads per process."""

    model: str = "demo"
    dtype: str = "float32"
    device: str = "cpu"
    chunks: int = 200
    chunk_tokens: int = 256
    actors: int = 2
    threads: int = 1
    batch_size: int = 8

    def __post_init__(self) -> None:
        for name in ("chunks", "chunk_tokens", "threads", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.actors < 0:
            raise ValueError(f"actors must be >= 0, got {self.actors}")


def corpus(count: int, chunk_tokens: int, encode: Callable[[str], list[int]]) -> list[str]:
    """``count`` distinct chunk texts of at most ``chunk_tokens`` tokens."""
    from blendrag_bench.datasets import fit_tokens, load_musique

    passages = dict.fromkeys(p.strip() for item in load_musique() for p in item.chunks)
    texts = [fit_tokens(p, chunk_tokens, lambda t: len(encode(t))) for p in passages if p]
    if len(texts) < count:
        raise ValueError(f"the MuSiQue subset has {len(texts)} distinct passages, {count} asked")
    return texts[:count]


def run(cfg: PrecomputeBenchConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Both jobs on the same chunks; their records."""
    from blendrag.cli.precompute_ray import LOCAL, connect
    from blendrag.distributed.ray import RayJob, precompute_texts

    with tempfile.TemporaryDirectory(prefix="blendrag-bench-precompute-") as tmp:
        settings = IngestSettings(model=cfg.model, dtype=cfg.dtype, device=cfg.device,
                                  threads=cfg.threads, chat=False, store=_store(tmp, "local"),
                                  batch_size=cfg.batch_size)
        engine = settings.build_engine()
        texts = corpus(cfg.chunks, cfg.chunk_tokens, engine.prompts.encode)
        say(f"local job: {len(texts)} chunks, one process, {cfg.threads} thread(s)")
        local = ingest_source(engine, texts, progress=False, batch_size=cfg.batch_size)
        engine.store.close()
        records = [_record("local", 1, local, 0.0, 0.0)]
        if cfg.actors:
            say(f"ray job: starting a local cluster for {cfg.actors} actors")
            t0 = time.perf_counter()
            ray, started = connect(LOCAL, num_cpus=cfg.actors)
            cluster_s = time.perf_counter() - t0
            try:
                result = precompute_texts(texts, settings.with_store(_store(tmp, "ray")),
                                          RayJob(actors=cfg.actors), progress=False)
            finally:
                if started:
                    ray.shutdown()
            st = result.steady
            records.append(_record("ray", cfg.actors, result.summary, cluster_s, st.startup_s,
                                   (st.computed, st.tokens, st.seconds)))
    return {"config": asdict(cfg), "records": records, "target": TARGET}


def _store(tmp: str, name: str) -> StoreConfig:
    return StoreConfig(ram_bytes=0, disk_dir=Path(tmp) / name, disk_bytes=16 << 30)


def _record(job: str, workers: int, summary, cluster_s: float, startup_s: float,
            steady: tuple[int, int, float] | None = None) -> dict:
    """One job's figures; ``steady``: the chunks, tokens and seconds its rates are taken over
    (default: the whole job)."""
    chunks, tokens, seconds = steady or (summary.computed, summary.tokens, summary.seconds)
    seconds = max(seconds, 1e-9)
    return {"job": job, "workers": workers, "chunks": summary.computed,
            "tokens": summary.tokens, "cluster_start_s": cluster_s, "startup_s": startup_s,
            "seconds": summary.seconds, "rate_chunks": chunks, "compute_s": seconds,
            "chunks_per_s": chunks / seconds, "tokens_per_s": tokens / seconds}


def format_report(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [f"precompute of {c['chunks']} chunks (up to {c['chunk_tokens']} tokens), model "
             f"{c['model']} ({c['dtype']}, {c['device']}), {c['threads']} thread(s) per process",
             f"{'job':<18}{'cluster s':>10}{'start-up s':>11}{'compute s':>10}"
             f"{'chunks/s':>10}{'tokens/s':>10}"]
    for r in report["records"]:
        name = "local, 1 process" if r["job"] == "local" else f"ray, {r['workers']} actors"
        lines.append(f"{name:<18}{r['cluster_start_s']:>10.1f}{r['startup_s']:>11.1f}"
                     f"{r['compute_s']:>10.1f}{r['chunks_per_s']:>10.1f}{r['tokens_per_s']:>10.0f}")
    if len(report["records"]) == 2:
        local, ray = report["records"]
        ratio = ray["tokens_per_s"] / local["tokens_per_s"]
        lines.append(f"ray / local after start-up: {ratio:.2f}x tokens/s (target with 2 actors "
                     f"on 2 cores: >= {report['target']}x)")
    return "\n".join(lines)
