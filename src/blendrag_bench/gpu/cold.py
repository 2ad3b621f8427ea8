"""The cold-start phase of the GPU check: a new process, an engine warmed up at load, then the
first request of every mode against a warm one of the same mode.

Run first, in a process of its own (as every phase): nothing is compiled yet unless the compile
cache (``~/.cache/blendrag/compile``) holds what an earlier process compiled, which the report
says (bytes loaded). Each mode's chunks are stored first, as an ingestion job would have, so
the first request is a warm request's path run for the first time: what it takes beyond a warm
one is what warm-up failed to pay.
"""

from __future__ import annotations

import statistics
import time

from blendrag.config import DEFAULT_GENERATION, BlendConfig
from blendrag.engine.request.warmup import WarmupConfig
from blendrag_bench.gpu.shapes import sync, workload
from blendrag_bench.gpu.speed import Emit
from blendrag_bench.gpu.summary import Headlines
from blendrag_bench.ttft import build_engine, random_layout

FIRST_TARGET = 2.0  # the first request of a mode at most this many times a warm one


def run(emit: Emit, small: bool, out: Headlines | None = None) -> Headlines:
    """Warm-up's time and, per mode, the first request's TTFT against the median of 3 warm;
    ``out`` takes each figure as it is measured."""
    out = {} if out is None else out
    w = workload(small, "3k")
    t0 = time.perf_counter()
    engine = build_engine(w)
    sync()
    emit(f"model built in {time.perf_counter() - t0:.1f} s ({w.layers} layers, {w.dtype})")
    modes = (BlendConfig(mode="full"), BlendConfig(mode="prefix"), BlendConfig(mode="reuse"),
             BlendConfig(mode="blend", selector="preview", ratio=0.2),
             BlendConfig(mode="blend", selector="epic", ratio=0.15))
    n = w.prefix_tokens + w.chunks * w.chunk_tokens + w.suffix_tokens
    report = engine.warmup(WarmupConfig(prompt_tokens=(n,), chunks=w.chunks,
                                        suffix_tokens=w.suffix_tokens, configs=modes))
    emit(report.summary())
    out["cold start: warm-up s"] = (report.seconds, "", None)
    out["cold start: compile cache bytes loaded"] = (float(report.loaded), "", None)
    for step, seconds in report.steps.items():
        emit(f"  {step:<32} {seconds * 1e3:9.1f} ms")
    layout = random_layout(w, engine.model.config.vocab_size)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)
    emit(f"\n{'mode':<24} {'first ms':>9} {'warm ms':>9} {'first/warm':>10}")
    worst = 0.0
    for config in modes:
        first = _ttft(engine, layout, config)
        warm = statistics.median(_ttft(engine, layout, config) for _ in range(3))
        worst = max(worst, first / warm)
        emit(f"{config.label:<24} {first * 1e3:9.1f} {warm * 1e3:9.1f} {first / warm:10.2f}")
    out["cold start: first request / warm, worst mode"] = (
        worst, f"<= {FIRST_TARGET:g}x", worst <= FIRST_TARGET)
    return out


def _ttft(engine, layout, config: BlendConfig) -> float:
    """A request's time to first token, with room for an answer of the default length, as
    a served request has (and as warm-up sized its buffers: WarmupConfig.answer_tokens)."""
    sync()
    t0 = time.perf_counter()
    engine.prefill(layout, config, extra_capacity=DEFAULT_GENERATION.max_new_tokens)
    sync()
    return time.perf_counter() - t0
