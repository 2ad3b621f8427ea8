"""TTFT with the cached rows on a storage tier: sequential against pipelined loading, and the
loading controller's ``ratio="auto"`` (``blendrag bench ttft --tier ...``).

One run, one tier (RAM, disk or Redis; optionally throttled to a modelled device,
``store/throttle.py``), the default TTFT workload's model and prompt. Rows, each the median of
``repeats`` timed calls after one warm-up, the calls of every row alternated:

- ``full``: full prefill (nothing loaded);
- ``sequential``: blend at the floor ratio, each layer's rows read when the loop needs them;
- ``pipelined``: the same request with the rows read ahead (``prefetch`` layers);
- ``auto``: pipelined with ``ratio="auto"`` (the controller's ratio, recorded);
- ``load-only``: reading every layer of every cached entry from the tier, nothing computed;
- ``compute-only``: the floor blend with the rows already in memory (nothing to read).

The target: pipelined TTFT <= ``pipeline_target`` (1.1 by default; the GPU check asks 1.15)
x max(load-only, compute-only) wherever the two are within 3x of each other; ``auto`` within
5 % of the floor's pipelined TTFT while recomputing more when loading is the bottleneck.
Quality is the first-token KL divergence from the full prefill (meaningful on a real model
only).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from blendrag.config import BlendConfig
from blendrag.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag.store import MemoryKVStore, StoreConfig, TieredKVStore
from blendrag.store.throttle import Throttle, ThrottledTier
from blendrag.store.tier import Tier
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout

TIERS = ("ram", "disk", "redis", "redis_cluster", "s3")


@dataclass(frozen=True)
class TierBenchConfig:
    workload: TTFTWorkload
    tier: str = "disk"
    bandwidth_gbps: float | None = None  # None: the tier's own speed
    latency_us: float = 0.0
    selector: str = "cacheblend"
    floor: float = 0.20
    prefetch: int = 4
    directory: Path | None = None  # disk tier's directory (None: a temporary one)
    pipeline_target: float = 1.1  # pipelined TTFT at most this x max(load-only, compute-only)

    def __post_init__(self) -> None:
        if not self.pipeline_target >= 1.0:
            raise ValueError(f"pipeline_target must be >= 1 (pipelined TTFT over max(load, "
                             f"compute)), got {self.pipeline_target}")
        if self.tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, got {self.tier!r}")
        if self.prefetch < 1:
            raise ValueError(f"prefetch must be >= 1 (the pipelined row), got {self.prefetch}")
        if self.bandwidth_gbps is not None:
            Throttle(self.bandwidth_gbps, self.latency_us)  # its checks
        BlendConfig(selector=self.selector, ratio=self.floor)

    @property
    def throttle(self) -> Throttle | None:
        return None if self.bandwidth_gbps is None else Throttle(self.bandwidth_gbps,
                                                                 self.latency_us)


def throttled(cfg: TierBenchConfig) -> Callable[[Tier], Tier] | None:
    """The ``wrap`` of a store whose tiers run at ``cfg``'s bandwidth and latency (None: as
    they are)."""
    throttle = cfg.throttle
    return None if throttle is None else (lambda t: ThrottledTier(t, throttle))


def tier_store(cfg: TierBenchConfig, stack: ExitStack) -> TieredKVStore:
    """A store whose only tier is ``cfg.tier`` (so no read is promoted into a faster one)."""
    wrap = throttled(cfg)
    kw = dict(ram_bytes=0, disk_dir=None)
    if cfg.tier == "ram":
        kw["ram_bytes"] = 16 << 30
    elif cfg.tier == "disk":
        directory = cfg.directory or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        kw.update(disk_dir=directory, disk_bytes=64 << 30)
    else:
        kw.update(shared_tier(cfg.tier, stack))
    store = TieredKVStore(StoreConfig(**kw), wrap=wrap)
    stack.callback(store.close)
    return store


def shared_tier(tier: str, stack: ExitStack) -> dict:
    """StoreConfig fields of a local server of ``tier`` (Redis, a 3-node Redis Cluster, Ceph
    RGW for S3), started on loopback and stopped when ``stack`` closes."""
    if tier == "redis":
        from blendrag_servers.redis_server import LocalRedis

        server = stack.enter_context(LocalRedis(stack.enter_context(tempfile.TemporaryDirectory())))
        return {"redis_url": server.url}
    if tier == "redis_cluster":
        from blendrag_servers.redis_cluster import LocalRedisCluster

        return {"redis_url": stack.enter_context(LocalRedisCluster()).url}
    import os

    from blendrag_servers.s3_server import LocalS3

    s3 = stack.enter_context(LocalS3())
    before = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())  # boto3's credential chain; this benchmark's own server
    stack.callback(_restore_environ, before)
    return {"s3_url": f"s3://{s3.bucket}/bench", "s3_endpoint_url": s3.endpoint}


def _restore_environ(saved: dict[str, str | None]) -> None:
    import os

    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def load_only(store: TieredKVStore, keys: list[str]) -> float:
    """Seconds to open every entry and read each of its layers (what the loop would be fed)."""
    t0 = time.perf_counter()
    entries = [store.open_layers(k) for k in keys]
    for i in range(entries[0].num_layers):
        for e in entries:
            e.layer(i)
    took = time.perf_counter() - t0
    for e in entries:
        e.close()
    return took


def _kl(logits: torch.Tensor, ref: torch.Tensor) -> float:
    """KL(full || blend) of the first-token distributions."""
    p, q = ref.float().log_softmax(-1), logits.float().log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


def precomputed(w: TTFTWorkload,
                profile: bool = False) -> tuple[BlendEngine, PromptLayout, MemoryKVStore]:
    """(engine, its prompt, a RAM store holding the prompt's chunk entries): the workload's
    model and prompt with every chunk computed, untimed."""
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    memory = MemoryKVStore(16 << 30)
    engine.store = memory
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile=profile)
    return engine, layout, memory


def run(cfg: TierBenchConfig) -> list[dict]:
    """The six rows (see the module docstring), one record each."""
    w = cfg.workload
    with ExitStack() as stack:
        engine, layout, memory = precomputed(w, profile=cfg.selector == "profile")
        store = tier_store(cfg, stack)
        keys = memory.keys()
        for key in keys:
            store.put(key, memory.get(key))
        floor = BlendConfig(selector=cfg.selector, ratio=cfg.floor)
        auto = BlendConfig(selector=cfg.selector, ratio=f"auto>={cfg.floor}")
        calls = {
            "full": (memory, BlendConfig(mode="full"), 0),
            "sequential": (store, floor, 0),
            "pipelined": (store, floor, cfg.prefetch),
            "auto": (store, auto, cfg.prefetch),
            "compute-only": (memory, floor, 0),
        }
        samples: dict[str, list] = {name: [] for name in [*calls, "load-only"]}
        for rep in range(w.repeats + 1):  # round-robin; the first round warms up
            for name, (where, config, prefetch) in calls.items():
                engine.store = where
                # each row as asked: it measures how loading overlaps that mode's compute
                engine.loading = dataclasses.replace(engine.loading, prefetch_layers=prefetch,
                                                     full_when_faster=False)
                pre = engine.prefill(layout, config)
                if rep:  # what is reported; the request itself is let go before the next:
                    # held, it keeps the runner's pooled KV buffer, and every later request
                    # would take a buffer of its own (no captured passes, a new allocation)
                    samples[name].append((pre.stats, pre.logits.clone()))
                del pre
            load = load_only(store, keys)
            if rep:
                samples["load-only"].append(load)
        return _records(cfg, samples, keys)


def _records(cfg: TierBenchConfig, samples: dict[str, list], keys: list[str]) -> list[dict]:
    """``samples``: per row, (stats, first-token logits) of each timed request (seconds for
    load-only)."""
    full_logits = samples["full"][-1][1]
    out = []
    for name, pres in samples.items():
        if name == "load-only":
            t = statistics.median(pres)
            out.append(_record(cfg, name, None, None, True, t, t, 0.0))
            continue
        st = [stats for stats, _ in pres]
        mid = sorted(range(len(st)), key=lambda i: st[i].timing.ttft_s)[len(st) // 2]
        s = st[mid]  # the middle call's stats; its times the medians, as load-only's
        rec = _record(cfg, name, s.selector, s.ratio, s.loading.pipelined,
                      statistics.median(x.timing.ttft_s for x in st),
                      statistics.median(x.loading.load_s for x in st),
                      statistics.median(x.loading.compute_s for x in st))
        rec.update(recompute_fraction=s.recompute_fraction,
                   controller=dataclasses.asdict(s.controller),
                   kl_vs_full=_kl(pres[mid][1], full_logits),
                   ratios=[x.ratio for x in st])
        if name in ("full", "compute-only"):
            rec["tier"] = "memory"
        out.append(rec)
    return out


def _record(cfg, mode, selector, ratio, pipelined, ttft, load, compute) -> dict:
    return {"mode": mode, "selector": selector, "ratio": ratio, "tier": cfg.tier,
            "pipelined": pipelined, "ttft_s": ttft, "load_s": load, "compute_s": compute}


def verdicts(records: list[dict], target: float = 1.1) -> list[str]:
    """The pipelining targets (pipelined TTFT <= ``target`` x max(load, compute)) against this
    run: PASS, MISS, or n/a (load and compute too far apart for the target to apply)."""
    r = {x["mode"]: x for x in records}
    load, compute = r["load-only"]["ttft_s"], r["compute-only"]["ttft_s"]
    bound = max(load, compute)
    apart = bound / max(min(load, compute), 1e-12)
    pipe, seq = r["pipelined"]["ttft_s"], r["sequential"]["ttft_s"]
    lines = [f"load-only {load * 1e3:.1f} ms, compute-only {compute * 1e3:.1f} ms "
             f"({apart:.2f}x apart); sequential {seq * 1e3:.1f} ms = "
             f"{seq / (load + compute):.2f} x their sum"]
    verdict = ("n/a (not within 3x)" if apart > 3
               else "PASS" if pipe <= target * bound else "MISS")
    lines.append(f"pipelined {pipe * 1e3:.1f} ms = {pipe / bound:.2f} x max(load, compute) "
                 f"(target <= {target:.2f} where within 3x): {verdict}")
    a = r["auto"]
    within = a["ttft_s"] / pipe - 1
    more = a["recompute_fraction"] > r["pipelined"]["recompute_fraction"]
    ok = within <= 0.05
    lines.append(f"auto: ratio {a['ratio']:.3f} (floor {r['pipelined']['ratio']:.2f}), TTFT "
                 f"{within:+.1%} vs the floor's pipelined (target <= +5 %), recomputes "
                 f"{'more' if more else 'the same'} ({a['recompute_fraction']:.3f} vs "
                 f"{r['pipelined']['recompute_fraction']:.3f}); KL vs full "
                 f"{a['kl_vs_full']:.4f} vs {r['pipelined']['kl_vs_full']:.4f}: "
                 f"{'PASS' if ok else 'MISS'}")
    return lines


def format_table(records: list[dict], cfg: TierBenchConfig) -> str:
    w = cfg.workload
    n = w.prefix_tokens + w.chunks * w.chunk_tokens + w.suffix_tokens
    model = w.model or f"random Mistral-shaped {w.layers}L h{w.hidden} {w.heads}/{w.kv_heads} heads"
    device = ("its own speed" if cfg.throttle is None else
              f"throttled to {cfg.bandwidth_gbps:g} GB/s + {cfg.latency_us:g} us a read")
    lines = [f"workload: {model}, {w.dtype} on {w.device}, prompt {n} tokens "
             f"({w.chunks}x{w.chunk_tokens} chunks); tier {cfg.tier} at {device}; "
             f"{cfg.selector} floor {cfg.floor:g}, prefetch {cfg.prefetch}; median of {w.repeats}",
             f"{'row':<14}{'tier':<8}{'ratio':>7}{'pipelined':>10}{'TTFT ms':>10}{'load ms':>10}"
             f"{'compute ms':>12}{'recomp':>8}{'KL/full':>9}"]
    for r in records:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        rec = r.get("recompute_fraction")
        kl = r.get("kl_vs_full")
        pipelined = "yes" if r["pipelined"] else "no"
        lines.append(f"{r['mode']:<14}{r['tier']:<8}{ratio:>7}{pipelined:>10}"
                     f"{r['ttft_s'] * 1e3:>10.1f}{r['load_s'] * 1e3:>10.1f}"
                     f"{r['compute_s'] * 1e3:>12.1f}"
                     f"{'-' if rec is None else f'{rec:.3f}':>8}"
                     f"{'-' if kl is None else f'{kl:.4f}':>9}")
    return "\n".join(lines + [""] + verdicts(records, cfg.pipeline_target))
