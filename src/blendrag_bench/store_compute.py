"""Store benchmark: the precompute's throughput against a plain HF forward of the same work,
each chunk over the prefix's cache computed once (the precompute computes its prefix once too),
alternated chunk by chunk so that machine noise hits both alike; and the HF forward of two
chunks at once, to tell whether batching the precompute pays on this device.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable

import torch

from blendrag.engine import BlendEngine
from blendrag.prompt import PromptLayout


def compute_throughput(engine: BlendEngine, layout: PromptLayout) -> dict:
    prefix = list(layout.prefix_ids)
    engine.cache.prefix(prefix)  # a job computes its prefix once
    past = prefix_cache(engine, prefix)  # and so does the yardstick: both compute the chunk
    warm = torch.randint(3, engine.model.config.vocab_size, (len(layout.chunk_ids[0]),)).tolist()
    hf_seconds(engine, [warm], past)
    engine.precompute(prefix, [warm])
    hf_s = pre_s = 0.0
    for chunk in layout.chunk_ids:  # alternated: noise hits both alike
        hf_s += hf_seconds(engine, [list(chunk)], past)
        pre_s += _timed(engine.device, lambda c=chunk: engine.precompute(prefix, [c]))
    tokens = sum(len(c) for c in layout.chunk_ids)
    return {"precompute_tokens_per_s": tokens / pre_s, "hf_forward_tokens_per_s": tokens / hf_s,
            "hf_forward_batched_tokens_per_s": _batched(engine, layout, prefix)}


def _batched(engine: BlendEngine, layout: PromptLayout, prefix: list[int]) -> dict[str, float]:
    """HF forward of chunks two at a time (does batching chunks pay on this device?)."""
    pairs = [layout.chunk_ids[i:i + 2] for i in range(0, len(layout.chunk_ids) - 1, 2)]
    if not pairs:
        return {}
    seconds = sum(hf_seconds(engine, [prefix + list(c) for c in pair]) for pair in pairs)
    return {"2": sum(len(c) for pair in pairs for c in pair) / seconds}


def cache_arg(model: torch.nn.Module) -> str:
    """The name a model's forward takes its KV cache by (``cache`` since transformers 5.2x,
    ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else \
        "past_key_values"


def prefix_cache(engine: BlendEngine, prefix: list[int]) -> object:
    """HF's KV cache of ``prefix`` (what ``model(chunk, cache=...)`` goes on from)."""
    with torch.inference_mode():
        ids = torch.tensor([prefix], device=engine.device)
        out = engine.model(ids, use_cache=True, logits_to_keep=1)
    return getattr(out, cache_arg(engine.model))


def hf_seconds(engine: BlendEngine, rows: list[list[int]], past: object = None) -> float:
    """A plain HF forward of ``rows``; after ``past`` (a copy, made before the clock starts:
    the forward appends to it) when given."""
    ids = torch.tensor(rows, device=engine.device)
    after = {} if past is None else {cache_arg(engine.model): copy.deepcopy(past)}

    def forward() -> None:
        with torch.inference_mode():
            engine.model(ids, logits_to_keep=1, **after)

    return _timed(engine.device, forward)


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
