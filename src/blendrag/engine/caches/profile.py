"""Context-sensitivity profiles: which of a chunk's tokens its context changes, measured once
at ingestion.

CacheBlend finds the tokens to recompute at query time from the KV deviation at a check
layer, and pays for a full recompute of every layer before it. On a deep model that is 1 of
32 layers; on a shallow one it is most of the budget, and an early layer's deviation is a
weak guess of which tokens matter later. A profile moves the measurement to ingestion: the
chunk is computed a second time after a neighbour chunk (its predecessor in the ingestion
order: in a source document, the passage it continues), and each token's key deviation from
the stand-alone computation, summed over layers and heads, is stored with the chunk KV
(``ChunkKV.profile``). With ``profile=k`` the chunk is measured after each of its k
predecessors and a token keeps its largest deviation: retrieval need not return a chunk right
after the passage it continues, and a token bound to any nearby passage should be marked. At
query time the ``profile`` selector recomputes the top tokens by that prior at every layer,
with no check layer.

Why keys, summed over layers: deep-layer keys are what later queries match against, so they
carry the cross-chunk bindings (a pronoun resolved to a name); an oracle ranking tokens by
their true deviation recovers the most cross-chunk questions when it ranks by keys summed over
layers, far more than by values or by layer-1 values (CacheBlend's signal): figures in
docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from blendrag.kv.chunk_kv import ChunkKV

if TYPE_CHECKING:
    from blendrag.engine.compute.runner import ModelRunner


def key_deviation(alone: ChunkKV, after: ChunkKV) -> torch.Tensor:
    """Per-token squared L2 distance of the pre-RoPE keys, summed over layers and heads.

    alone: the chunk computed after the prefix only; after: the same chunk computed after a
    neighbour. Returns [T] float32 on the CPU.
    """
    if alone.token_ids != after.token_ids:
        raise ValueError("key_deviation compares two computations of the same chunk tokens")
    diff = after.keys.float() - alone.keys.float()  # [L, Hkv, T, D]
    return diff.pow(2).sum(dim=(0, 1, 3)).cpu()  # [T]


def neighbours(chunks: Sequence[Sequence[int]], i: int, k: int = 1) -> list[Sequence[int]]:
    """The chunks a profile of ``chunks[i]`` is measured after: the ``k`` before it, nearest
    first, cyclically (the first chunk takes the last ones) and never itself; none for a lone
    chunk."""
    return [chunks[(i - j) % len(chunks)] for j in range(1, min(k, len(chunks) - 1) + 1)]


def profiled(runner: ModelRunner, kv: ChunkKV, chunk_prefix_ids: Sequence[int],
             probes: Sequence[Sequence[int]], chunk_prefix: ChunkKV | None = None) -> ChunkKV:
    """``kv`` (a chunk computed after ``chunk_prefix_ids``) with its context-sensitivity
    profile: the chunk is computed again after ``chunk_prefix_ids + probe`` for each probe (the
    chunk prefix's rows from ``chunk_prefix``, its cached KV, when given) and each token keeps
    its largest key deviation from ``kv``."""
    if not probes or any(isinstance(p, int) or not len(p) for p in probes):
        raise ValueError("profiled needs a list of probes, each a non-empty list of token ids")
    t = kv.num_tokens
    deviations = []
    for probe in probes:
        both = runner.compute_chunk(chunk_prefix, chunk_prefix_ids, [*probe, *kv.token_ids])
        after = ChunkKV(both.keys[:, :, -t:], both.values[:, :, -t:], kv.token_ids)
        deviations.append(key_deviation(kv, after))
    return kv.with_profile(torch.stack(deviations).amax(dim=0))  # [T]
