"""Print the cross-tenant timing figures (docs/benchmarks.md, "Signed and encrypted entries"):
tenant B's request for a passage tenant A cached, against one for a passage no one cached
(Kolmogorov-Smirnov), with B's own hit as the positive control. The same arms as
tests/blendrag/engine/test_tenant_requests.py (tests/helpers/tenant_timing.py), on the same
tiny random-weight model, RAM tier, one torch thread.

    .venv/bin/python scripts/tenant_timing.py [--samples 250]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test's helpers

from blendrag import EngineSpec  # noqa: E402
from blendrag.engine.caches.context import NO_CONTEXT  # noqa: E402
from blendrag.store import StoreConfig  # noqa: E402
from helpers.tenant_timing import arms, ks  # noqa: E402
from helpers.tiny import COMPUTED_FIRST, build_config, build_tokenizer, save_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=250, help="requests per arm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp())
    save_model(build_config("llama"), folder)
    build_tokenizer(folder)
    engine = EngineSpec(model=str(folder), device="cpu", chat=False, chunk_prefix="",
                        context=NO_CONTEXT, threads=None,
                        store=StoreConfig(ram_bytes=64 << 20, disk_dir=None),
                        # a cold miss computed in the request, as the figures were measured
                        # (the default's backfill worker would run beside the timed requests)
                        loading=COMPUTED_FIRST).build()
    probe, cold, hit = arms(engine.namespaced("tenant-a"), engine.namespaced("tenant-b"),
                            args.samples)
    for name, times in (("cross-tenant probe", probe), ("own hit (control)", hit)):
        d, p = ks(times, cold)
        print(f"{name} vs cold miss: KS D = {d:.3f}, p = {p:.3g}; medians "
              f"{np.median(times) * 1e3:.2f} vs {np.median(cold) * 1e3:.2f} ms "
              f"({args.samples} samples an arm)")


if __name__ == "__main__":
    main()
