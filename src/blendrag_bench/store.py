"""Store benchmark: the stored bytes per token against the formula, the precompute throughput
against a plain HF forward, and the load throughput of each tier against a plain read of the
same bytes from the same device. Workload: the TTFT benchmark's default (``TTFTWorkload``).

- bytes per token: size of one stored entry file / its tokens, beside
  2 x layers x kv_heads x head_dim x bytes per element; the difference is the metadata.
- precompute: ``engine.precompute`` of each chunk after the cached prefix, store writes included
  (disk tier, RAM skipped as in a bulk job), beside ``model(chunk, past_key_values=<the
  prefix's cache>, logits_to_keep=1)`` (the same work: the chunk over a prefix computed once);
  both in chunk tokens per second, alternated chunk by chunk so machine noise hits both alike.
- load: ``store.get`` of one whole chunk from a store holding only that tier, beside a memcpy
  (RAM), a plain ``read()`` of the entry file (disk; page cache dropped before both when the
  kernel lets us, reported), a plain GET (Redis, a local redis-server on a free loopback port).
  The RAM tier returns its tensors by reference, so its load includes one memcpy into a request
  buffer: every tier's figure then moves the bytes once. GB/s = 1e9 bytes per second.
- batching: HF forward of two chunks at once, to tell whether batching the precompute pays.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from blendrag.engine.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag.store import DiskTier, StoreConfig, TieredKVStore
from blendrag.store.s3_tier import parse_s3_url
from blendrag_bench import store_formats
from blendrag_bench.raw_io import (
    copy_bytes,
    drop_page_cache,
    file_read_seconds,
    memcpy_seconds,
)
from blendrag_bench.store_compute import compute_throughput
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout
from blendrag_bench.ttft_tiers import shared_tier
from blendrag_servers.redis_server import RedisUnavailable
from blendrag_servers.s3_server import S3Unavailable

TIERS = ("ram", "disk", "redis", "redis_cluster", "s3")
SHARED = TIERS[2:]  # tiers on a server, started on loopback for the run


@dataclass(frozen=True)
class StoreBenchConfig:
    """workload: model and chunk shapes; repeats: timed loads per tier (median reported);
    directory: where the disk tier lives (None: a temporary directory, removed after);
    shared: the server tiers to measure too (``SHARED``: Redis needs redis-server, a Redis
    Cluster redis-server and redis-cli, S3 Ceph's mon, osd and radosgw)."""

    workload: TTFTWorkload = field(default_factory=TTFTWorkload)
    repeats: int = 9
    directory: Path | None = None
    shared: tuple[str, ...] = ("redis",)
    kl_items: int = 0  # > 0: each stored format's KL against the uncompressed KV (format_kl.py)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.kl_items < 0:
            raise ValueError(f"kl_items must be >= 0, got {self.kl_items}")
        if unknown := set(self.shared) - set(SHARED):
            raise ValueError(f"unknown server tiers {sorted(unknown)}; known: {SHARED}")


def run(cfg: StoreBenchConfig) -> dict:
    """Every figure, as the JSON object ``bench store --json`` writes."""
    w = cfg.workload
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    with _directory(cfg.directory) as directory:
        engine.store = TieredKVStore(_config(directory, layout, engine))
        report = {"workload": _describe(w, engine)}
        report |= compute_throughput(engine, layout)
        key = engine.key(layout.prefix_ids, layout.chunk_ids[0])
        entry = _entry_path(directory, key)
        report |= _entry_size(engine, entry, len(layout.chunk_ids[0]))
        report |= _load_throughput(cfg, engine.store, key, directory, entry)
        kv = engine.store.get(key)
        if kv is not None:
            report["formats"] = store_formats.measure(kv, key, cfg.repeats)
        engine.store.close()
    if cfg.kl_items and "formats" in report:
        from blendrag_bench.format_kl import kl_on_musique

        kl = kl_on_musique(cfg.kl_items)
        for record in report["formats"]:
            record["kl_vs_uncompressed"] = kl[record["format"]]
        report["kl_items"] = cfg.kl_items
    return report


def _config(directory: Path, layout: PromptLayout, engine: BlendEngine) -> StoreConfig:
    """RAM and disk tiers with room for every entry of the workload (and the warm-up chunk),
    entries in the model's dtype: this section compares stored bytes with the KV formula and
    tier reads with plain reads; each stored format is timed apart (``store_formats.py``)."""
    tokens = (
        len(layout.prefix_ids) + sum(len(c) for c in layout.chunk_ids) + len(layout.chunk_ids[0])
    )
    room = tokens * _formula(engine) + (64 << 20)
    return StoreConfig(ram_bytes=room, disk_dir=directory, disk_bytes=room, kv_format="model")


@contextlib.contextmanager
def _directory(directory: Path | None) -> Iterator[Path]:
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="blendrag-bench-store-") as tmp:
        yield Path(tmp)


def _describe(w: TTFTWorkload, engine: BlendEngine) -> dict:
    c = engine.model.config
    return {"model": w.model or "random Mistral-shaped", "layers": c.num_hidden_layers,
            "kv_heads": c.num_key_value_heads, "head_dim": _head_dim(c), "dtype": w.dtype,
            "device": w.device, "chunks": w.chunks,
            "chunk_tokens": w.chunk_tokens, "prefix_tokens": w.prefix_tokens,
            "threads": torch.get_num_threads()}


# ---- bytes per token ---------------------------------------------------------------------------

def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _formula(engine: BlendEngine) -> int:
    """2 (K, V) x layers x kv_heads x head_dim x bytes per element, from the model's config."""
    c = engine.model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * _head_dim(c) * engine.dtype.itemsize


def _entry_path(directory: Path, key: str) -> Path:
    tier = DiskTier(directory, None)
    try:
        path = tier.entry_path(key)
    finally:
        tier.close()
    if path is None:
        raise RuntimeError("the precomputed entry is not on disk (disk budget too small?)")
    return path


def _entry_size(engine: BlendEngine, entry: Path, tokens: int) -> dict:
    size, formula = entry.stat().st_size, _formula(engine)
    return {"entry_bytes": size, "entry_tokens": tokens, "bytes_per_token": size / tokens,
            "bytes_per_token_formula": formula, "metadata_bytes": size - formula * tokens}


# ---- loads per tier ----------------------------------------------------------------------------

def _load_throughput(cfg: StoreBenchConfig, store: TieredKVStore, key: str, directory: Path,
                     entry: Path) -> dict:
    kv = store.get(key)  # from disk; now in RAM too
    load = {"ram": _ram(cfg, store, key, kv.nbytes)}
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=directory,
                                   disk_bytes=store.config.disk_bytes)) as disk:
        load["disk"], cached, cold = _disk(cfg, disk, key, entry)
    notes = {}
    for tier in SHARED:
        load[tier], notes[tier] = (_shared(cfg, kv, key, tier) if tier in cfg.shared
                                   else ((None, None), "not requested"))
    return {"load_gbps": {t: load[t][0] for t in TIERS},
            "raw_read_gbps": {t: load[t][1] for t in TIERS},
            "disk_page_cache_dropped": cold,
            "disk_page_cache_gbps": {"load": cached[0], "raw_read": cached[1]},
            "tier_notes": notes}


def _gbps(nbytes: int, samples: list[float]) -> float:
    return nbytes / statistics.median(samples) / 1e9


def _ram(cfg: StoreBenchConfig, store: TieredKVStore, key: str, nbytes: int) -> tuple[float, float]:
    """get (a reference) + one memcpy into a request buffer, beside a memcpy of as many bytes."""
    dst = torch.zeros(nbytes, dtype=torch.uint8)  # touched: no page faults in the timed copies
    raw_src, raw_dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    loads, raws = [], []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        kv = store.get(key)
        copy_bytes(dst, kv.keys)
        copy_bytes(dst, kv.values, offset=nbytes // 2)
        loads.append(time.perf_counter() - t0)
        raws.append(memcpy_seconds(raw_dst, raw_src))
    return _gbps(nbytes, loads), _gbps(nbytes, raws)


def _disk(cfg: StoreBenchConfig, disk: TieredKVStore, key: str, entry: Path):
    """(cold load, cold raw), (page-cache load, page-cache raw), whether the cache was dropped."""
    size = entry.stat().st_size
    cold = {"load": [], "raw": []}
    warm = {"load": [], "raw": []}
    dropped = True
    for _ in range(cfg.repeats):
        dropped &= drop_page_cache(entry)
        cold["load"].append(_timed_get(disk, key))
        warm["load"].append(_timed_get(disk, key))
        dropped &= drop_page_cache(entry)
        cold["raw"].append(file_read_seconds(entry))
        warm["raw"].append(file_read_seconds(entry))
    pair = lambda d: (_gbps(size, d["load"]), _gbps(size, d["raw"]))  # noqa: E731
    return pair(cold), pair(warm), dropped


def _timed_get(store: TieredKVStore, key: str) -> float:
    t0 = time.perf_counter()
    kv = store.get(key)
    seconds = time.perf_counter() - t0
    if kv is None:
        raise RuntimeError("the entry vanished from the store during the benchmark")
    return seconds


def _shared(cfg: StoreBenchConfig, kv, key: str,
            tier: str) -> tuple[tuple[float | None, float | None], str]:
    """(whole-entry load, plain GET of the same bytes) in GB/s from a local server of ``tier``
    and what it was; (None, None) and why when the server cannot be started here."""
    with ExitStack() as stack:
        try:
            fields = shared_tier(tier, stack)
        except (RedisUnavailable, S3Unavailable, ImportError) as exc:
            return (None, None), str(exc)
        store = stack.enter_context(TieredKVStore(StoreConfig(
            ram_bytes=0, disk_dir=None, kv_format="model", **fields)))
        store.put(key, kv)
        plain_get = _plain_get(fields, stack)
        size = len(plain_get(key))
        loads, raws = [], []
        for _ in range(cfg.repeats):
            loads.append(_timed_get(store, key))
            t0 = time.perf_counter()
            plain_get(key)
            raws.append(time.perf_counter() - t0)
        where = fields.get("redis_url") or fields.get("s3_endpoint_url")
        return (_gbps(size, loads), _gbps(size, raws)), f"local {tier} at {where}"


def _plain_get(fields: dict, stack: ExitStack):
    """key -> the stored bytes, read with the server's own client and nothing else."""
    if "redis_url" in fields:
        import redis

        node = redis.Redis.from_url(fields["redis_url"])
        cluster = node.info("cluster").get("cluster_enabled") == 1
        client = redis.RedisCluster.from_url(fields["redis_url"]) if cluster else node
        stack.callback(client.close)
        return lambda key: client.get(f"{StoreConfig.redis_prefix.rstrip(':')}:{key}")
    import boto3

    bucket, prefix = parse_s3_url(fields["s3_url"])
    client = boto3.session.Session().client("s3", endpoint_url=fields["s3_endpoint_url"])
    return lambda key: client.get_object(Bucket=bucket, Key=f"{prefix}/{key}")["Body"].read()


# ---- report ------------------------------------------------------------------------------------

def format_report(r: dict) -> str:
    w = r["workload"]
    lines = [f"workload: {w['model']} {w['layers']}L, {w['kv_heads']} kv heads x {w['head_dim']}, "
             f"{w['dtype']} on "
             f"{w['device']} ({w['threads']} threads); {w['chunks']} chunks x {w['chunk_tokens']} "
             f"tokens after a {w['prefix_tokens']}-token prefix",
             f"bytes/token   stored {r['bytes_per_token']:.2f}   formula "
             f"{r['bytes_per_token_formula']}   "
             f"metadata {r['metadata_bytes']} B per {r['entry_tokens']}-token entry "
             f"({r['metadata_bytes'] / r['entry_bytes']:.3%})",
             f"precompute    {r['precompute_tokens_per_s']:.0f} tokens/s   "
             f"HF forward {r['hf_forward_tokens_per_s']:.0f} tokens/s   ratio "
             f"{r['precompute_tokens_per_s'] / r['hf_forward_tokens_per_s']:.2f}x",
             *_batching_line(r),
             f"{'tier':<18}{'load GB/s':>10}{'raw GB/s':>10}{'ratio':>8}"]
    rows = [(t, r["load_gbps"][t], r["raw_read_gbps"][t]) for t in TIERS]
    rows.insert(2,
                ("disk (page cache)", r["disk_page_cache_gbps"]["load"],
                 r["disk_page_cache_gbps"]["raw_read"]))
    for name, load, raw in rows:
        if load is None:
            lines.append(f"{name:<18}{'-':>10}{'-':>10}{'-':>8}   {r['tier_notes'][name]}")
        else:
            lines.append(f"{name:<18}{load:>10.2f}{raw:>10.2f}{load / raw:>7.2f}x")
    lines.append("disk page cache dropped before each cold read: "
                 f"{'yes' if r['disk_page_cache_dropped'] else 'NO'}")
    if r.get("formats"):
        lines += store_formats.format_lines(r["formats"])
    return "\n".join(lines)


def _batching_line(r: dict) -> list[str]:
    two = r["hf_forward_batched_tokens_per_s"].get("2")
    if two is None:
        return []
    return [f"batching      HF forward of 2 chunks at once {two:.0f} tokens/s "
            f"({two / r['hf_forward_tokens_per_s']:.2f}x one at a time)"]


def ratios(r: dict) -> list[str]:
    """The headline ratios of a run, one line each (figures only; the project's targets for
    them are in docs/benchmarks.md)."""
    out = ["precompute vs HF forward: "
           f"{r['precompute_tokens_per_s'] / r['hf_forward_tokens_per_s']:.2f}x",
           "bytes/token over the formula: "
           f"{r['bytes_per_token'] / r['bytes_per_token_formula'] - 1:+.3%}"]
    for t in TIERS:
        load, raw = r["load_gbps"][t], r["raw_read_gbps"][t]
        if load is None:
            out.append(f"{t} load: not measured ({r['tier_notes'][t]})")
        else:
            out.append(f"{t} load vs raw read: {load / raw:.2f}x")
    return out


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
