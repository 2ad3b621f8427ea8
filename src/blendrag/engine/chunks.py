"""Computing chunk KVs with the engine's own layer loop: a chunk after a prefix, a chunk in the
ingestion context (``engine/context.py``), and a chunk's context-sensitivity profile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from blendrag.engine.fused_kv import CachedSegment
from blendrag.engine.prefill import LoopPlan, run_loop
from blendrag.engine.profile import key_deviation
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.keys import hash_ids

if TYPE_CHECKING:
    from blendrag.engine.engine import BlendEngine


def prefill_chunk(engine: BlendEngine, prefix: ChunkKV | None, prefix_ids: Sequence[int],
                  chunk_ids: Sequence[int]) -> ChunkKV:
    """Prefill ``chunk_ids`` after ``prefix_ids`` and keep the chunk's rows (pre-RoPE keys).

    A short prefix is recomputed with the chunk: one plain causal block takes the fast
    attention kernel, which costs less than the masked attention of chunk queries over cached
    prefix rows. A long prefix (over a quarter of the chunk) comes from ``prefix``, its KV."""
    p, n = len(prefix_ids), len(prefix_ids) + len(chunk_ids)
    dev = engine.device
    ids = torch.tensor(list(prefix_ids) + list(chunk_ids), device=dev)
    if prefix is None or 4 * p <= n - p:
        plan = LoopPlan(ids, [], torch.arange(0, n, device=dev), capture=True)
    else:
        plan = LoopPlan(ids, [CachedSegment(0, prefix)], torch.arange(p, n, device=dev),
                        capture=True)
    out = run_loop(engine.adapter, plan, engine._buffer(n), engine.rope(n))
    rows = slice(plan.active.numel() - len(chunk_ids), None)  # captured = active; chunk's last
    return ChunkKV(out.keys[:, :, rows].contiguous(), out.values[:, :, rows].contiguous(),
                   tuple(chunk_ids), hash_ids(prefix_ids) if prefix_ids else "")


def in_context(engine: BlendEngine, alone: ChunkKV, chunk_prefix_ids: Sequence[int],
               fillers: Sequence[tuple[Sequence[int], ChunkKV]], tag: str) -> ChunkKV:
    """The chunk of ``alone`` (computed after the chunk prefix) computed after the chunk prefix
    + each filler instead (``fillers``: each filler's ids and the KV of chunk prefix + filler),
    K and V averaged over the fillers, with its context shift: per layer, the squared distance
    of each token's averaged values from ``alone``'s, summed over heads. -> ChunkKV [L, Hkv, T, D]
    tagged ``tag``."""
    ids = list(alone.token_ids)
    keys, values = torch.zeros_like(alone.keys), torch.zeros_like(alone.values)
    for filler_ids, filler_kv in fillers:
        kv = prefill_chunk(engine, filler_kv, [*chunk_prefix_ids, *filler_ids], ids)
        keys += kv.keys
        values += kv.values
    keys /= len(fillers)
    values /= len(fillers)
    shift = (values.float() - alone.values.float()).pow(2).sum(dim=(1, 3)).cpu()  # [L, T]
    return ChunkKV(keys, values, alone.token_ids, alone.prefix_hash, alone.sensitivity, tag, shift)


def profiled(engine: BlendEngine, kv: ChunkKV, chunk_prefix_ids: Sequence[int],
             probes: Sequence[Sequence[int]], chunk_prefix: ChunkKV | None = None) -> ChunkKV:
    """``kv`` with its context-sensitivity profile: the chunk is computed again after
    ``chunk_prefix_ids + probe`` for each probe (the chunk prefix's rows from ``chunk_prefix``,
    its cached KV, when given) and each token keeps its largest key deviation from ``kv``."""
    if not probes or any(isinstance(p, int) or not len(p) for p in probes):
        raise ValueError("profiled needs a list of probes, each a non-empty list of token ids")
    t = kv.num_tokens
    deviations = []
    for probe in probes:
        both = prefill_chunk(engine, chunk_prefix, chunk_prefix_ids, [*probe, *kv.token_ids])
        after = ChunkKV(both.keys[:, :, -t:], both.values[:, :, -t:], kv.token_ids)
        deviations.append(key_deviation(kv, after))
    return kv.with_sensitivity(torch.stack(deviations).amax(dim=0))  # [T]
