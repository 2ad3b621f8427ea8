"""The speed phases of the GPU check: TTFT of every mode, a multi-turn chat, loading from disk
to the device, decoding. Each writes its report through ``emit`` and returns its headline
figures with their targets: ``{name: (value, target text, met)}`` (met None: no target)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

import torch

from blendrag.config import BlendConfig
from blendrag.engine.compute.fused_kv import CachedSegment
from blendrag.store import StoreConfig, TieredKVStore
from blendrag_bench.gpu import link
from blendrag_bench.gpu.shapes import sync, workload
from blendrag_bench.gpu.summary import Headlines
from blendrag_bench.timing import median_time
from blendrag_bench.ttft import build_engine, random_layout

Emit = Callable[[str], None]

# minimum speed-up over a full prefill, per prompt (the GPU targets); reuse from the device
# tier (hot chunks in GPU memory) and from the host's RAM tier, copied to the device
TTFT_TARGETS = {
    "3k": {"default (preview@20%)": 2.5, "fastest blend@15%": 3.5, "reuse, device tier": 10.0,
           "reuse, RAM tier": 5.0, "prefix": 1.0},
    "16k": {"default (preview@20%)": 3.5, "fastest blend@15%": 5.5, "reuse, device tier": 30.0,
            "prefix": 1.05},
}
PIPELINE_TARGET = 1.15  # pipelined TTFT from the disk tier over max(load, compute)
RAM_TO_DEVICE_GBPS = 25.0  # cached rows from the RAM tier to the device (the loading phase)


def ttft(emit: Emit, small: bool, prompt: str) -> Headlines:
    """``bench ttft`` at the prompt's size: every mode's TTFT against a full prefill."""
    from blendrag_bench.ttft import RAM_TIER, format_table, run

    w = workload(small, prompt)
    records = run(w)
    emit(format_table(records, w))
    by = {(r["mode"], r["selector"], r["ratio"]): r for r in records}
    reuse = by[("reuse", None, None)]
    # its rows from the RAM tier: the row timed with the device tier set aside, or reuse's own
    # when the engine has no device tier
    ram = by.get(("reuse", RAM_TIER, None), reuse)
    speedup = "speedup_vs_full"
    picks = {"default (preview@20%)": by[("blend", "preview", 0.20)],
             "fastest blend@15%": max((r for r in records
                                       if r["mode"] == "blend" and r["ratio"] == 0.15),
                                      key=lambda r: r[speedup]),
             "prefix": by[("prefix", None, None)], "reuse, RAM tier": ram}
    targets = TTFT_TARGETS[prompt]
    out: Headlines = {}
    for k, r in picks.items():
        v = r[speedup]
        out[f"{prompt} {k}"] = ((_ran(r), f">= {targets[k]:g}x", v >= targets[k])
                                if k in targets else (_ran(r), "", None))
    # always reported: with no device-tier hits (no device tier, or it held nothing) a miss
    least = targets["reuse, device tier"]
    out[f"{prompt} reuse, device tier"] = (
        _ran(reuse) if reuse["device_hits"] else "no device-tier hits", f">= {least:g}x",
        bool(reuse["device_hits"]) and reuse[speedup] >= least)
    full_vs_hf = by[("full", None, None)]["ttft_s"] / by[("hf", None, None)]["ttft_s"] - 1
    out[f"{prompt} full vs HF forward"] = (full_vs_hf, "within 5 %", abs(full_vs_hf) <= 0.05)
    slowest = min((r for r in records if r["mode"] not in ("hf", "full")),
                  key=lambda r: r[speedup])
    out[f"{prompt} slowest mode vs full"] = (_ran(slowest), ">= 0.95x",
                                             slowest[speedup] >= 0.95)
    return out


def _ran(record: dict) -> float | str:
    """A mode's speed-up over a full prefill, said to be a full prefill's where the request
    ran as one (the engine's choice: ``ran_full``), not as its mode."""
    v = record["speedup_vs_full"]
    return f"{v:.2f}x (ran full)" if record.get("ran_full") else v


def chat(emit: Emit, small: bool, out: Headlines | None = None) -> Headlines:
    """``bench chat`` on the random workloads at the check's shape, 4 turns: the same passages
    every turn (the prefix cache), new ones every turn ahead of the history (the history
    cache). ``out`` takes each workload's figures as its table is done."""
    from blendrag_bench.chat_bench import ChatBenchConfig, format_table, run

    out = {} if out is None else out
    w = workload(small, "3k", suffix_tokens=32)
    for name in ("random", "random-history"):  # each table as it is done: a stop keeps it
        cfg = ChatBenchConfig(workloads=(name,), dtype=w.dtype, device=w.device, random=w,
                              turns=4, answer_tokens=32)
        records = run(cfg)
        emit(format_table(records, cfg))
        out.update(_chat_figures(name, records))
    return out


def _chat_figures(workload: str, records: list[dict]) -> Headlines:
    later = [r for r in records if r["turn"] >= 2]
    if workload == "random":
        from blendrag_bench.chat_bench import EXACT_TARGET

        exact = min(r["speedup_vs_full"] for r in later if r["config"] == "full+prefix-cache")
        # the chat bench's own verdict: blend with the prefix cache against its exact twin
        # (a full prefill with a prefix cache of its own) on the same prompts, past turn 1
        twins = [r["vs_exact"] for r in later if r["config"] == "blend+prefix-cache"
                 and "vs_exact" in r]
        blend = min(twins) if twins else "not measured"
        return {"chat turns >= 2, full+prefix-cache": (exact, ">= 10x", exact >= 10),
                "chat turns >= 2, blend+prefix-cache vs its exact twin": (
                    blend, f">= {EXACT_TARGET:g}x",
                    isinstance(blend, float) and blend >= EXACT_TARGET)}
    vs_without = min(r["without_ttft_s"] / r["ttft_s"] for r in later)
    vs_full = min(r["full_ttft_s"] / r["ttft_s"] for r in later)
    return {"chat, new passages, turns >= 2 vs no history reuse": (vs_without, ">= 2x",
                                                                   vs_without >= 2),
            "chat, new passages, turns >= 2 vs full": (vs_full, ">= 3x", vs_full >= 3)}


def loading(emit: Emit, small: bool, out: Headlines | None = None) -> Headlines:
    """Cached rows from the disk tier (page cache) and from the RAM tier to the device through
    the layer feed (read, copied, placed), alone; then ``bench ttft --tier disk`` (pipelined
    against max(load, compute)). ``out`` takes each figure as it is measured."""
    from blendrag_bench.ttft_tiers import TierBenchConfig, format_table, run

    out = {} if out is None else out
    w = workload(small, "3k")
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    rates, held = {}, None
    for tier, config in (("disk tier (page cache)", StoreConfig(
            ram_bytes=0, disk_dir=tempfile.mkdtemp(), kv_format="model", disk_bytes=64 << 30)),
                         ("RAM tier", StoreConfig(ram_bytes=8 << 30, disk_dir=None,
                                                  kv_format="model"))):
        store = TieredKVStore(config)
        engine.store = store
        engine.precompute(layout.prefix_ids, layout.chunk_ids)
        rates[tier], load_s, nbytes = _feed_rate(engine, store, layout)
        emit(f"{tier} -> {w.device} through the layer feed (read, copied, keys rotated), "
             f"{nbytes / 2**20:.0f} MiB: median {load_s * 1e3:.1f} ms of 3 = "
             f"{rates[tier]:.2f} GB/s")
        if tier == "RAM tier":  # an entry the RAM tier holds: page-locked on CUDA?
            held = store.get(engine.key(layout.prefix_ids, layout.chunk_ids[0]))
            out["RAM tier -> device"] = (rates[tier], f">= {RAM_TO_DEVICE_GBPS:g} GB/s",
                                         rates[tier] >= RAM_TO_DEVICE_GBPS)
        else:
            out["disk -> device"] = (rates[tier], ">= 10 GB/s", rates[tier] >= 10)
        store.close()
    del engine
    out.update(link.run(emit, nbytes, held.nbytes if held else 64 << 20,
                        held.keys if held else None))
    del held
    cfg = TierBenchConfig(workload=w, tier="disk", pipeline_target=PIPELINE_TARGET)
    records = run(cfg)
    emit("")
    emit(format_table(records, cfg))
    r = {x["mode"]: x for x in records}
    load, compute = r["load-only"]["ttft_s"], r["compute-only"]["ttft_s"]
    pipe = r["pipelined"]["ttft_s"] / max(load, compute)
    # the target applies where load and compute are within 3x of each other
    near = max(load, compute) <= 3 * min(load, compute)
    out["pipelined TTFT / max(load, compute), disk"] = (
        pipe, f"<= {PIPELINE_TARGET:g} (load and compute within 3x)",
        pipe <= PIPELINE_TARGET if near else None)
    return out


def _feed_rate(engine, store: TieredKVStore, layout) -> tuple[float, float, int]:
    """(GB/s, median seconds, bytes) of every cached row of ``layout``'s chunks placed in a
    request buffer on the device through the layer feed, from ``store``: median of 3 after a
    warm round, the entries opened inside the timing (opening starts reading ahead)."""
    keys = [engine.key(layout.prefix_ids, c) for c in layout.chunk_ids]
    starts = [len(layout.prefix_ids) + sum(len(c) for c in layout.chunk_ids[:i])
              for i in range(len(keys))]
    n, nbytes = layout.num_tokens, 0
    rope = engine.runner.rope(n)  # read only: made once, outside the timing

    def load() -> None:
        nonlocal nbytes
        fused = engine.runner.buffer(n)
        sync()
        entries = [store.open_layers(k) for k in keys]
        feed = engine.runner.feed([CachedSegment(s, e) for s, e in zip(starts, entries)],
                                  fused, rope, depth=4)
        for i in range(engine.adapter.num_layers):
            feed.wait(i)
        sync()
        feed.close()
        nbytes = sum(e.layer_nbytes for e in entries) * engine.adapter.num_layers
        for e in entries:
            e.close()

    load_s = median_time(load, 4, skip=1).seconds
    return nbytes / load_s / 1e9, load_s, nbytes


def decode(emit: Emit, small: bool, out: Headlines | None = None) -> Headlines:
    """Tokens per second after a 3k-token full prefill: the engine eager, the engine's
    fixed-shape step (a CUDA graph on CUDA), HF ``generate``; the greedy tokens compared.
    ``out`` takes each rate as it is measured, then the ratios."""
    out = {} if out is None else out
    from blendrag.engine.compute.runner import ComputeConfig
    from blendrag.engine.engine import BlendEngine

    steps = 8 if small else 64
    w = workload(small, "3k")
    model = build_engine(w).model
    layout = random_layout(w, model.config.vocab_size)
    rates, tokens, logits = {}, {}, {}
    for label, compute in (("engine eager", ComputeConfig(decode="eager")),
                           ("engine graph", ComputeConfig(decode="graph"))):
        engine = BlendEngine(model, None, compute=compute, threads=None)
        rates[label], tokens[label], logits[label] = _engine_decode(engine, layout, steps)
        engine.runner.release_buffers()
        _emit_rate(emit, label, rates, tokens)  # each as measured: a stopped phase keeps it
        out[f"decode {label} (tokens/s)"] = (rates[label], "", None)
    ids = torch.tensor([layout.ids], device=model.device)
    rates["HF generate"], tokens["HF generate"], logits["HF generate"] = _hf_decode(
        model, ids, steps + 1)
    _emit_rate(emit, "HF generate", rates, tokens)
    out["decode HF generate (tokens/s)"] = (rates["HF generate"], "", None)
    for label in ("engine graph", "engine eager"):
        emit(f"greedy tokens ({steps + 1}), {label} vs HF generate: "
             + divergence(tokens[label], logits[label], tokens["HF generate"],
                          logits["HF generate"]))
    hf = rates["HF generate"]
    out["decode eager vs HF generate"] = (rates["engine eager"] / hf, ">= 1x",
                                          rates["engine eager"] >= hf)
    out["decode graph vs HF generate"] = (rates["engine graph"] / hf, ">= 2x",
                                          rates["engine graph"] >= 2 * hf)
    return out


def _emit_rate(emit: Emit, label: str, rates: dict[str, float],
               tokens: dict[str, list[int]]) -> None:
    emit(f"{label:<14} {rates[label]:8.1f} tokens/s  first tokens {tokens[label][:8]}")


def divergence(mine: list[int], my_logits: list[torch.Tensor], theirs: list[int],
               their_logits: list[torch.Tensor]) -> str:
    """Where two greedy runs part, and how close the choice was there: each run's logit
    margin between the two tokens (a margin within the dtype's rounding is a tie that either
    kernel may break)."""
    j = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    if j is None:
        return f"the same {min(len(mine), len(theirs))} tokens"
    a, b = mine[j], theirs[j]
    ours, hf = my_logits[j].float(), their_logits[j].float()
    return (f"the same up to token {j}, then {a} against {b}: margin {ours[a] - ours[b]:.4f} "
            f"in the engine's logits, {hf[b] - hf[a]:.4f} in HF's (largest logit "
            f"{hf.abs().max():.2f})")


def _engine_decode(engine, layout, steps: int) -> tuple[float, list[int], list[torch.Tensor]]:
    """Tokens per second over ``steps`` decoded tokens (best of 2 after a warm-up, which also
    captures the graph), the greedy tokens (the first from the prefill) and the logits each
    was chosen from."""
    best, tokens, logits = float("inf"), [], []
    for _ in range(3):
        pre = engine.prefill(layout, BlendConfig(mode="full"), extra_capacity=steps + 1)
        logits = [pre.logits]
        tokens = [int(pre.logits.argmax())]
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            logits.append(engine.runner.decode(tokens[-1], pre.fused))
            tokens.append(int(logits[-1].argmax()))
        sync()
        best = min(best, time.perf_counter() - t0)
    return steps / best, tokens, logits


def _hf_decode(model, ids: torch.Tensor,
               new: int) -> tuple[float, list[int], list[torch.Tensor]]:
    """Tokens per second of HF ``generate`` past its first token (``new`` tokens less one),
    its ``new`` greedy tokens and the logits of each (an untimed run)."""

    def generate(n: int, scores: bool = False):
        with torch.inference_mode():
            sync()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, output_logits=scores,
                                 return_dict_in_generate=True)
            sync()
        return time.perf_counter() - t0, out

    generate(2)
    one = min(generate(1)[0] for _ in range(2))  # the prefill and the first token
    times = [generate(new)[0] for _ in range(2)]
    _, out = generate(new, scores=True)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    return (new - 1) / max(min(times) - one, 1e-9), tokens, [s[0] for s in out.logits]
