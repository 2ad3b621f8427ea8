"""Kernels of one cached request on its loop's thread, and how many of them place the cached rows.

    python scripts/placing_kernels.py [--layers 32]

The default workload of ``bench ttft`` (random Mistral-shaped model, 32 prefix + 6 x 512 chunk
+ 64 suffix tokens, chunk KVs precomputed in the RAM store), loaded sequentially
(``prefetch_layers=0``) so that the placing runs on the loop's thread, where a
``TorchDispatchMode`` sees it. Kernels: the aten ops that are not views (on a GPU, one launch
each). A reuse request and a cacheblend@15 % one, each after a warm-up call, with the CPU's
bound on the rotation's scratch (blocks of layers that fit its caches) and with a GPU's
(``rope.SCRATCH_BYTES``). The figures quoted in docs/benchmarks.md ("Placing every layer at
once") and docs/architecture.md.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blendrag import BlendConfig
from blendrag.engine.compute import fused_kv
from blendrag.model import rope
from blendrag_bench.ttft import TTFTWorkload, build_engine, random_layout

VIEWS = {"slice", "select", "unsqueeze", "view", "as_strided", "alias", "expand", "detach",
         "t", "transpose", "_unsafe_view"}


class Kernels(TorchDispatchMode):
    """Non-view aten ops on this thread: all, and those inside ``FusedKV.place`` by name."""

    def __init__(self) -> None:
        super().__init__()
        self.total, self.placing, self.inside = 0, Counter[str](), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.total += 1
            if self.inside:
                self.placing[name] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    counted = Kernels()
    place = fused_kv.FusedKV.place

    def placing(self, *a, **kw):  # the ops of FusedKV.place, whatever its signature
        counted.inside = True
        try:
            return place(self, *a, **kw)
        finally:
            counted.inside = False

    fused_kv.FusedKV.place = placing  # type: ignore[method-assign]
    w = TTFTWorkload(layers=args.layers)
    engine = build_engine(w)
    layout = random_layout(w, engine.model.config.vocab_size)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)
    engine.loading = dataclasses.replace(engine.loading, prefetch_layers=0)
    bounds = {"the CPU's": rope.SCRATCH_BYTES["cpu"], "a GPU's": rope.SCRATCH_BYTES["cuda"]}
    for bound_name, bound in bounds.items():
        rope.SCRATCH_BYTES["cpu"] = bound
        for config in (BlendConfig(mode="reuse"),
                       BlendConfig(selector="cacheblend", ratio=0.15)):
            engine.prefill(layout, config)  # warm: the pooled buffer, the store's RAM tier
            counted.total, counted.placing = 0, Counter()
            with counted:
                engine.prefill(layout, config)
            print(f"{config.label}, {bound_name} scratch bound: {counted.total} kernels per "
                  f"request, {sum(counted.placing.values())} placing cached rows "
                  f"{dict(counted.placing)}")


if __name__ == "__main__":
    main()
