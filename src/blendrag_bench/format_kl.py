"""What each stored K/V format does to a blend's output (``blendrag bench store --kl-items N``):
on the quality benchmark's model and its first N MuSiQue items, the chunk KVs are precomputed
into a disk-only store in each format, and the default blend's first-token distribution read
through that store is compared with the one read through the uncompressed (``model``) store:
KL(uncompressed || format), the mean over the items. The same engine, items and blend config
for every format; "model" is 0 by construction."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from blendrag.config import BlendConfig
from blendrag.engine.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.config import KV_FORMATS
from blendrag_bench.datasets import load_musique
from blendrag_bench.quality import QualityConfig, load_engine

DEFAULT_BLEND = BlendConfig()


def kl_on_musique(items: int, config: BlendConfig = DEFAULT_BLEND) -> dict[str, float]:
    """format -> mean first-token KL(uncompressed || format) over the quality benchmark's model
    and first ``items`` MuSiQue items."""
    engine = load_engine(QualityConfig())
    layouts = [engine.build_prompt(i.prefix, i.chunks, i.suffix)
               for i in load_musique(limit=items)]
    return kl_vs_uncompressed(engine, layouts, config)


def kl_vs_uncompressed(engine: BlendEngine, layouts: list[PromptLayout],
                       config: BlendConfig = DEFAULT_BLEND) -> dict[str, float]:
    """format -> mean first-token KL(uncompressed || format) of ``config`` over ``layouts``,
    each layout's chunks stored in that format and read back (``engine.store`` is replaced)."""
    logits: dict[str, list[torch.Tensor]] = {}
    with tempfile.TemporaryDirectory(prefix="blendrag-format-kl-") as tmp:
        for kv_format in KV_FORMATS:
            with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=Path(tmp) / kv_format,
                                           kv_format=kv_format)) as store:
                engine.store = store
                for layout in layouts:  # stored, then every cached row read back through it
                    engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))
                logits[kv_format] = [engine.prefill(layout, config).logits.float()
                                     for layout in layouts]
    exact = logits["model"]
    return {f: statistics.fmean(_kl(p, q) for p, q in zip(exact, got))
            for f, got in logits.items()}


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) of two next-token distributions given as logits [vocab]."""
    p = torch.log_softmax(p_logits.double(), -1)  # float64: tiny KLs are not rounding noise
    q = torch.log_softmax(q_logits.double(), -1)
    return float(torch.sum(p.exp() * (p - q)).clamp_min(0.0))
