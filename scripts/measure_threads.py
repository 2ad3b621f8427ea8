#!/usr/bin/env python
"""How many torch threads should `--threads` default to? Precompute throughput (computed
tokens/s, as `blendrag precompute --json` reports it) of the demo's 20 real passages on the
default model at --threads 1, 2 and 0 (torch's own choice: one per core), each run in a fresh
process and a fresh store, the settings interleaved round by round so that machine load hits
them alike. Usage: ``python scripts/measure_threads.py [--rounds 3] [--passages 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from blendrag_demo.corpora import real_corpus

SETTINGS = ("1", "2", "0")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per setting (default: 3)")
    p.add_argument("--passages", type=int, default=20, help="passages per run (default: 20)")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="model to run (default: smollm2-135m-instruct)")
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    rates: dict[str, list[float]] = {t: [] for t in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "passages"
        folder.mkdir()
        for i, passage in enumerate(real_corpus().passages[: args.passages]):
            (folder / f"{i:02d}.txt").write_text(passage.text)
        for r in range(args.rounds):
            for t in SETTINGS:
                out = subprocess.run(
                    [sys.executable, "-m", "blendrag.cli", "precompute", "--model", args.model,
                     "--folder", str(folder), "--chunk-prefix", "", "--device", "cpu",
                     "--store-dir", f"{tmp}/kv-{t}-{r}", "--threads", t, "--no-progress",
                     "--json"], check=True, capture_output=True, text=True).stdout
                rates[t].append(json.loads(out)["tokens_per_s"])
                print(f"round {r + 1}: --threads {t}: {rates[t][-1]:.0f} tokens/s", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    for t, v in rates.items():
        print(f"--threads {t}: median {statistics.median(v):.0f} tokens/s, range "
              f"{min(v):.0f}-{max(v):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
