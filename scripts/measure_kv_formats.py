#!/usr/bin/env python
"""Which stored K/V format (``StoreConfig.kv_format``) should be the default? For each format,
the default model's MuSiQue quality run (full prefill and the default blend config) on an
engine whose store keeps entries on disk only, in that format, so every cached row is read
back through it: KL(full || blend) on the first token and over full's answer, the share of
answers equal to full's, against the exact ("model") format, and the bytes per stored token.
The same items, engine weights and blend config for every format.

Usage: ``python scripts/measure_kv_formats.py [--items 12] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.config import KV_FORMATS
from blendrag_bench.datasets import load_musique
from blendrag_bench.quality import QualityConfig, run_quality

DEFAULT = BlendConfig()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=12, help="MuSiQue questions (default: 12)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    items = load_musique(limit=args.items)
    config = QualityConfig(modes=("full", "blend"), selectors=(DEFAULT.selector,),
                           ratios=(float(DEFAULT.ratio),), warmup=False)
    base = BlendEngine.from_pretrained(config.model, threads=None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kv_format in KV_FORMATS:
            store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=Path(tmp) / kv_format,
                                              kv_format=kv_format))
            engine = BlendEngine(base.model, base.tokenizer, store=store,
                                 chat=base.prompts.chat if base.prompts else None, threads=None)
            report = run_quality(items, config, engine=engine, dataset="musique")
            blend = next(s for s in report.summaries if s.mode == "blend")
            usage = store.stats().tier("disk")
            rows.append((kv_format, blend, usage.used_bytes))
            print(f"{kv_format:<9} first-token KL {blend.kl:.5f}  answer KL {blend.answer_kl:.5f}"
                  f"  same answer {blend.same_answer:.3f}  disk bytes {usage.used_bytes:,}",
                  flush=True)
            store.close()
    exact = rows[0]
    print(f"\n{report.items} items, blend {DEFAULT.label}; against the exact format:")
    print(f"{'format':<9}{'bytes':>8}{'dKL first':>11}{'dKL answer':>12}{'same answer':>13}")
    for kv_format, blend, used in rows:
        print(f"{kv_format:<9}{used / exact[2]:>8.3f}{blend.kl - exact[1].kl:>+11.5f}"
              f"{blend.answer_kl - exact[1].answer_kl:>+12.5f}{blend.same_answer:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
