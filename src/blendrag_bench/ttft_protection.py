"""What signing and encrypting stored entries cost: the same tier, plain against signed against
encrypted (``blendrag bench ttft --tier T --protection plain,signed,encrypted``).

One run, one tier (disk, Redis, a Redis Cluster or S3 on a local server), the default TTFT
workload's model and prompt; its chunk entries written to one store per protection (each a
namespace of its own, so the three never share an entry). Rows, each the median of ``repeats``
after one warm-up, the protections alternated within every repeat so that drift in the
machine's load falls on all of them:

- ``write``: storing every chunk entry (encoding, digests, the tag, encryption);
- ``load-only``: opening every entry and reading each of its layers, nothing computed;
- ``get``: every entry read whole and decoded, as a bulk reader does;
- ``pipelined``: a blend request at the floor ratio with the rows read ahead (its TTFT).

Each row's throughput (GB/s of entry bytes) and its ratio to the plain store's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from contextlib import ExitStack

from blendrag.config import BlendConfig
from blendrag.store import MemoryKVStore, StoreConfig, TieredKVStore
from blendrag.store.auth import StoreKeys
from blendrag_bench.ttft_tiers import (
    TierBenchConfig,
    load_only,
    precomputed,
    throttled,
    tier_store,
)

PROTECTIONS = ("plain", "signed", "encrypted")
KEYS = StoreKeys({"bench": bytes(range(32))}, "bench")  # a fixed key: nothing here is secret


def protection_config(config: StoreConfig, protection: str) -> StoreConfig:
    """``config`` plain, signed or signed and encrypted, in a namespace of its own."""
    if protection not in PROTECTIONS:
        raise ValueError(f"protection must be one of {PROTECTIONS}, got {protection!r}")
    keys = None if protection == "plain" else KEYS
    return dataclasses.replace(config, namespace=f"bench-{protection}", auth_key=keys,
                               encrypt=protection == "encrypted")


def run(cfg: TierBenchConfig, protections: tuple[str, ...] = PROTECTIONS) -> list[dict]:
    """One record per protection and row (see the module docstring)."""
    if cfg.tier == "ram":  # before any model is built
        raise ValueError("--protection needs a tier that stores bytes: disk, redis, "
                         "redis_cluster or s3")
    for p in protections:
        protection_config(StoreConfig(), p)  # refuses an unknown one now
    w = cfg.workload
    with ExitStack() as stack:
        engine, layout, memory = precomputed(w)
        keys = memory.keys()
        base = tier_store(cfg, stack)
        stores = {p: TieredKVStore(protection_config(base.config, p), wrap=throttled(cfg))
                  for p in protections}  # at the bench's bandwidth and latency, as base
        for store in stores.values():
            stack.callback(store.close)
        floor = BlendConfig(selector=cfg.selector, ratio=cfg.floor)
        engine.loading = dataclasses.replace(engine.loading, prefetch_layers=cfg.prefetch,
                                             full_when_faster=False)
        nbytes = sum(memory.get(k).nbytes for k in keys)
        samples: dict[tuple[str, str], list[float]] = {}
        for rep in range(w.repeats + 1):  # the first round warms up
            for p, store in stores.items():
                took = _store_rows(store, memory, keys)
                engine.store = store
                took["pipelined"] = engine.prefill(layout, floor).stats.timing.ttft_s
                if rep:
                    for row, t in took.items():
                        samples.setdefault((p, row), []).append(t)
        return _records(samples, nbytes, cfg.tier)


def _store_rows(store: TieredKVStore, memory: MemoryKVStore, keys: list[str]) -> dict:
    """Seconds to write every entry, to read every layer of each, and to get each whole."""
    t0 = time.perf_counter()
    for k in keys:
        store.put(k, memory.get(k))
    write = time.perf_counter() - t0
    load = load_only(store, keys)
    t0 = time.perf_counter()
    for k in keys:
        store.get(k)
    return {"write": write, "load-only": load, "get": time.perf_counter() - t0}


def _records(samples: dict[tuple[str, str], list[float]], nbytes: int, tier: str) -> list[dict]:
    out = []
    for (protection, row), times in samples.items():
        t = statistics.median(times)
        plain = statistics.median(samples[("plain", row)]) if ("plain", row) in samples else None
        out.append({"tier": tier, "protection": protection, "row": row, "seconds": t,
                    "gbps": nbytes / t / 1e9 if row != "pipelined" else None,
                    "vs_plain": None if plain is None else t / plain, "bytes": nbytes})
    return out


def format_table(records: list[dict], cfg: TierBenchConfig) -> str:
    w = cfg.workload
    mib = records[0]["bytes"] / (1 << 20) if records else 0.0
    lines = [f"tier {cfg.tier}: {w.chunks} entries of {w.chunk_tokens} tokens "
             f"({mib:.1f} MiB in memory), {w.layers} layers; {cfg.selector} floor {cfg.floor:g}, "
             f"prefetch {cfg.prefetch}; median of {w.repeats}",
             f"{'row':<11}{'protection':<11}{'ms':>9}{'GB/s':>8}{'x plain':>9}"]
    for r in sorted(records, key=lambda r: (r["row"], PROTECTIONS.index(r["protection"]))):
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.2f}"
        ratio = "-" if r["vs_plain"] is None else f"{r['vs_plain']:.2f}"
        lines.append(f"{r['row']:<11}{r['protection']:<11}{r['seconds'] * 1e3:>9.1f}{gbps:>8}"
                     f"{ratio:>9}")
    return "\n".join(lines)
