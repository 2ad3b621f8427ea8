#!/usr/bin/env python
"""How many torch threads should the engine (``BlendEngine(threads=...)``, the CLI's
``--threads``) default to? Two measures at 1, 2 and torch's own choice (one per core), each run
in a fresh process, the settings interleaved round by round so that machine load hits them
alike:

- precompute throughput (computed tokens/s, as `blendrag precompute --json` reports it) of the
  demo's real passages on the default model, a fresh store each run;
- from Python, the full-prefill TTFT of a prompt of the first passages that fit in
  ``--prefill-tokens`` (700 by default: 413 tokens with the default model, whose passages are
  long), median of 3 calls after one warm-up, through
  ``BlendEngine.from_pretrained(..., threads=...)``.

Usage: ``python scripts/measure_threads.py [--rounds 3] [--passages 20]``.
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

# One setting's full-prefill TTFT from Python, in a fresh process: prints seconds.
_PREFILL = """
import statistics, sys
from blendrag import BlendConfig, BlendEngine
from blendrag_demo.corpora import real_corpus
threads = int(sys.argv[1]) or None
engine = BlendEngine.from_pretrained(sys.argv[2], device="cpu", threads=threads)
text, want = "", int(sys.argv[3])
for p in real_corpus().passages:
    if len(engine.prompts.encode(text + p.text)) > want:
        break
    text += p.text + "\\n\\n"
layout = engine.build_prompt("Read the passages.\\n\\n", [text], "Question: who?\\nAnswer:")
times = [engine.prefill(layout, BlendConfig(mode="full")).stats.timing.ttft_s for _ in range(4)]
print(layout.num_tokens, statistics.median(times[1:]))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per setting (default: 3)")
    p.add_argument("--passages", type=int, default=20, help="passages per run (default: 20)")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="model to run (default: smollm2-135m-instruct)")
    p.add_argument("--prefill-tokens", type=int, default=700,
                   help="length of the full-prefill prompt (default: 700)")
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    rates: dict[str, list[float]] = {t: [] for t in SETTINGS}
    ttfts: dict[str, list[float]] = {t: [] for t in SETTINGS}
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
                tokens, ttft = subprocess.run(
                    [sys.executable, "-c", _PREFILL, t, args.model, str(args.prefill_tokens)],
                    check=True, capture_output=True, text=True).stdout.split()
                ttfts[t].append(float(ttft))
                print(f"round {r + 1}: threads {t}: precompute {rates[t][-1]:.0f} tokens/s; "
                      f"full prefill of {tokens} tokens {ttfts[t][-1] * 1e3:.0f} ms", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    for t, v in rates.items():
        w = ttfts[t]
        print(f"threads {t}: precompute median {statistics.median(v):.0f} tokens/s (range "
              f"{min(v):.0f}-{max(v):.0f}); full prefill median {statistics.median(w) * 1e3:.0f} "
              f"ms (range {min(w) * 1e3:.0f}-{max(w) * 1e3:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
