"""TTFT and peak memory of every prefill mode on identical inputs, side by side.

Default workload: a random-weight model with Mistral-7B's depth and GQA (32 layers, 4:1),
narrowed to run on 2 CPU cores; 6 chunks x 512 tokens after a 32-token prefix, a 64-token
suffix. Chunk KVs are precomputed (as ingestion would) before anything is timed; every timed
call includes fetching them from the store.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from blendrag.config import BlendConfig
from blendrag.engine.compute.observers import PHASES, PhaseClock
from blendrag.engine.compute.runner import ComputeConfig
from blendrag.engine.engine import BlendEngine
from blendrag.engine.request.prefill import Prefill
from blendrag.ingest.ingestion import kv_bytes_per_token
from blendrag.prompt import PromptLayout
from blendrag.store import StoreConfig, TieredKVStore
from blendrag_bench.flops import FlopModel
from blendrag_bench.memory import memory_mode, peak_bytes, timing_mode

REUSE = BlendConfig(mode="reuse")
RAM_REUSE = "reuse, RAM tier"
RAM_TIER = "RAM tier"
"""With a device tier (on a GPU by default), reuse is timed twice: its rows from the device
tier (the ``reuse`` row), and from the store's host RAM tier, copied to the device (the row
whose selector column says ``RAM tier``). On a GPU the engine's store is then a RAM tier in
host memory (``ram_store``): the default in-memory store would hold the rows where they were
computed, on the device, and the row would copy nothing."""
RAM_STORE_BYTES = 32 << 30  # host memory for the RAM tier of a GPU run (a 16k prompt: 2 GiB)


@dataclass(frozen=True)
class TTFTWorkload:
    """Model shape (ignored with ``model``), prompt shape and what to run."""

    # a name, folder, GGUF file or hub id; None: random weights of the shape below
    model: str | None = None
    gguf_file: str | None = None
    layers: int = 32
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 1792
    vocab: int = 32000
    chunks: int = 6
    chunk_tokens: int = 512
    prefix_tokens: int = 32
    suffix_tokens: int = 64
    ratios: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.30)
    selectors: tuple[str, ...] = ("preview", "cacheblend", "profile", "epic")
    repeats: int = 3
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    pass_attention: str = "kernel"  # ComputeConfig.pass_attention: the captured passes' attention

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "chunks", "chunk_tokens",
                     "suffix_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads or self.hidden % self.heads:
            raise ValueError("heads must divide hidden and kv_heads must divide heads")
        ComputeConfig(pass_attention=self.pass_attention)  # refuses an unknown one


def build_engine(w: TTFTWorkload) -> BlendEngine:
    compute = ComputeConfig(pass_attention=w.pass_attention)
    if w.model is not None:
        return BlendEngine.from_pretrained(w.model, dtype=w.dtype, device=w.device,
                                           gguf_file=w.gguf_file, threads=None, compute=compute)
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(w.seed)
    config = MistralConfig(
        vocab_size=w.vocab, hidden_size=w.hidden, intermediate_size=w.intermediate,
        num_hidden_layers=w.layers, num_attention_heads=w.heads, num_key_value_heads=w.kv_heads,
        max_position_embeddings=32768, sliding_window=None, tie_word_embeddings=False)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[w.dtype]
    with torch.device(w.device):
        model = MistralForCausalLM(config).to(dtype)
    return BlendEngine(model.eval(), tokenizer=None, threads=None, compute=compute)


def random_layout(w: TTFTWorkload, vocab: int) -> PromptLayout:
    g = torch.Generator().manual_seed(w.seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    return PromptLayout(ids(w.prefix_tokens), [ids(w.chunk_tokens) for _ in range(w.chunks)],
                        ids(w.suffix_tokens))


def configs(w: TTFTWorkload) -> list[BlendConfig]:
    out = [BlendConfig(mode="full"), BlendConfig(mode="prefix"), BlendConfig(mode="reuse")]
    out += [BlendConfig(mode="blend", selector=s, ratio=r) for s in w.selectors for r in w.ratios]
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(w: TTFTWorkload, on_step: Callable[[str, int, int], None] | None = None) -> list[dict]:
    """Time HF's forward and every mode, then measure their peak memory; one record per row.

    ``on_step(phase, done, total)``: progress, after each step of each phase ("precompute",
    "timing", "memory")."""
    step = on_step or (lambda phase, done, total: None)
    engine = build_engine(w)
    if engine.cache.device_tier is not None:  # the RAM tier's rows in host memory
        engine.store = ram_store()
    layout = random_layout(w, engine.model.config.vocab_size)
    # ingestion, not timed
    step("precompute", 0, 1)
    engine.precompute(layout.prefix_ids, layout.chunk_ids, profile="profile" in w.selectors)
    step("precompute", 1, 1)
    ids = torch.tensor([layout.ids], device=engine.device)

    def hf() -> torch.Tensor:
        with torch.inference_mode():
            return engine.model(ids, logits_to_keep=1).logits

    # (label, config, the selector column: RAM_TIER for rows from the host tiers only)
    cases = [(c.label, c, c.selector if c.mode == "blend" else None) for c in configs(w)]
    if engine.cache.device_tier is not None:  # reuse from the host's RAM tier too
        cases.append((RAM_REUSE, REUSE, RAM_TIER))

    def prefill(config: BlendConfig, column: str | None, observers=()) -> Prefill:
        call = partial(engine.prefill, layout, config, observers=observers)
        return _off_device_tier(engine, call) if column == RAM_TIER else call()

    runs = {"hf": hf} | {label: partial(prefill, c, column) for label, c, column in cases}
    times: dict[str, list[float]] = {k: [] for k in runs}
    replayed = dict.fromkeys(runs, 0)  # timed calls whose passes were replayed (CUDA graphs)
    total = (w.repeats + 1) * len(runs)
    timing_mode()  # the same allocator settings in every run, the first included
    for rep in range(w.repeats + 1):  # round-robin so that machine noise hits every mode alike
        for i, (label, fn) in enumerate(runs.items(), 1):
            _sync(engine.device)
            before = _replays(engine)
            t0 = time.perf_counter()
            fn()
            _sync(engine.device)
            if rep:  # the first round warms up
                times[label].append(time.perf_counter() - t0)
                replayed[label] += _replays(engine) > before
            step("timing", rep * len(runs) + i, total)
    memory_mode()  # RSS follows live tensors only under it; it would slow the timing
    peaks = {}
    for i, (label, fn) in enumerate(runs.items(), 1):
        peaks[label] = peak_bytes(fn, engine.device)
        step("memory", i, len(runs))
    # one more call per mode, timed phase by phase (on CUDA it synchronizes at every phase)
    stats, phases = {}, {}
    for label, c, column in cases:
        clock = PhaseClock(engine.device)
        stats[label] = prefill(c, column, [clock]).stats
        phases[label] = clock.seconds
    flops = FlopModel.of(engine.adapter)
    full_label = BlendConfig(mode="full").label
    full_s = statistics.median(times[full_label])
    full_flops = flops.request(stats[full_label])
    records = [_record("hf", None, None, times["hf"], full_s, peaks["hf"], None)]
    for label, c, column in cases:
        st = stats[label]
        ran = st.controller.mode.ran if st.controller.mode is not None else c.label
        records.append(_record(c.mode, column, c.ratio if c.mode == "blend" else None,
                               times[label], full_s, peaks[label], st.recompute_fraction)
                       | {"ideal_speedup": full_flops / flops.request(st),
                          "phase_s": phases[label], "ran_full": ran != c.label,
                          "replayed": replayed[label], "device_hits": st.cache.device_hits,
                          "reused_bytes": st.cache.tokens_reused * kv_bytes_per_token(engine)})
    return records


def ram_store() -> TieredKVStore:
    """A store of one RAM tier in host memory (rows from a GPU page-locked: kv/locked.py)."""
    return TieredKVStore(StoreConfig(ram_bytes=RAM_STORE_BYTES, disk_dir=None))


def _off_device_tier(engine: BlendEngine, call: Callable[[], Prefill]) -> Prefill:
    """``call()`` with the engine's device tier set aside: its cached rows come from the
    store's host tiers (copied to the device), as on an engine without one."""
    tier, engine.cache.device_tier = engine.cache.device_tier, None
    try:
        return call()
    finally:
        engine.cache.device_tier = tier


def _replays(engine) -> int:
    """The cached passes the engine's runner replayed from CUDA graphs so far."""
    passes = engine.runner.static_passes
    return 0 if passes is None else passes.replays


def _record(mode, selector, ratio, samples, full_s, peak, recompute) -> dict:
    ttft = statistics.median(samples)
    return {"mode": mode, "selector": selector, "ratio": ratio, "ttft_s": ttft,
            "speedup_vs_full": full_s / ttft, "ttft_min_s": min(samples),
            "ttft_max_s": max(samples),
            "peak_extra_mib": peak / 2**20, "recompute_fraction": recompute}


def breakdown_rows(records: list[dict]) -> list[dict]:
    """The records the phase breakdown shows: full, reuse, the fastest blend at 15 % and the
    default (preview at 20 %)."""
    at15 = [r for r in records if r["mode"] == "blend" and r["ratio"] == 0.15]
    default = BlendConfig()
    rows = [r for r in records if r["mode"] in ("full", "reuse")]
    if at15:
        rows.append(min(at15, key=lambda r: r["ttft_s"]))
    rows += [r for r in records if r["mode"] == "blend" and r["selector"] == default.selector
             and r["ratio"] == default.ratio and r not in rows]
    return rows


def format_breakdown(records: list[dict]) -> str:
    """Milliseconds per phase (engine/compute/observers.py) of one timed call per row."""
    rows = breakdown_rows(records)
    shown = [p for p in PHASES if any((r.get("phase_s") or {}).get(p, 0) >= 5e-4 for r in rows)]
    lines = ["where the time goes (ms, one call each, timed phase by phase):",
             f"{'mode':<22}" + "".join(f"{p:>10}" for p in shown) + f"{'sum':>10}"]
    for r in rows:
        ph = r.get("phase_s") or {}
        name = (f"{r['selector']}@{r['ratio']:.0%}" if r["mode"] == "blend"
                else f"{r['mode']}, {r['selector']}" if r["selector"] else r["mode"])
        lines.append(f"{name:<22}" + "".join(f"{ph.get(p, 0) * 1e3:>10.1f}" for p in shown)
                     + f"{sum(ph.values()) * 1e3:>10.1f}")
    return "\n".join(lines)


def format_table(records: list[dict], w: TTFTWorkload) -> str:
    n = w.prefix_tokens + w.chunks * w.chunk_tokens + w.suffix_tokens
    model = w.model or f"random Mistral-shaped {w.layers}L h{w.hidden} {w.heads}/{w.kv_heads} heads"
    lines = [f"workload: {model}, {w.dtype} on {w.device}, prompt {n} tokens = {w.prefix_tokens} "
             f"prefix + {w.chunks}x{w.chunk_tokens} chunks + {w.suffix_tokens} suffix; "
             f"median of {w.repeats}",
             "ideal: full prefill's FLOPs over the mode's (blendrag_bench/flops.py); "
             "share: speedup / ideal",
             f"{'mode':<8}{'selector':<12}{'ratio':>6}{'TTFT ms':>10}{'min-max ms':>16}"
             f"{'speedup':>9}{'ideal':>8}{'share':>7}{'peak MiB':>10}{'recomp':>8}"]
    for r in records:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        rec = f"{r['recompute_fraction']:.3f}" if r["recompute_fraction"] is not None else "-"
        span = f"{r['ttft_min_s'] * 1e3:.0f}-{r['ttft_max_s'] * 1e3:.0f}"
        ideal = r.get("ideal_speedup")
        ideal_s = f"{ideal:>7.2f}x{r['speedup_vs_full'] / ideal:>7.2f}" if ideal else f"{'-':>15}"
        lines.append(f"{r['mode']:<8}{r['selector'] or '-':<12}{ratio:>6}{r['ttft_s'] * 1e3:>10.1f}"
                     f"{span:>16}{r['speedup_vs_full']:>8.2f}x{ideal_s}"
                     f"{r['peak_extra_mib']:>10.1f}{rec:>8}" + ("  ran full" if r.get("ran_full")
                                                               else "")
                     + (f"  {r['replayed']}/{w.repeats} replayed" if r.get("replayed") else ""))
    if any(r.get("replayed") for r in records):
        lines.append("replayed: timed calls whose cached passes were replayed from CUDA graphs "
                     "(engine/compute/static_pass.py: a shape is captured at its second call)")
    if any(r.get("ran_full") for r in records):
        lines.append("ran full: this device's cost profile predicted the mode slower than a full "
                     "prefill, which ran instead (LoadingConfig.full_when_faster)")
    return "\n".join(lines) + "\n\n" + format_breakdown(records)


def write_json(records: list[dict], path: Path) -> None:
    """The records, each with at least mode, selector, ratio, ttft_s, speedup_vs_full."""
    path.write_text(json.dumps(records, indent=2))
