#!/usr/bin/env python
"""Start-up time of the `blendrag` command: wall time of `--help` of every command, each run
in a fresh process (what a user waits for). Target: under 1 s. Usage:
``python scripts/bench_cli.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ["", "precompute", "cache", "cache stats", "cache clear", "demo", "bench",
            "bench ttft", "bench store", "bench quality"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="processes per command (default: 5)")
    args = p.parse_args()
    exe = shutil.which("blendrag") or str(Path(sys.executable).with_name("blendrag"))
    worst = 0.0
    for command in COMMANDS:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([exe, *command.split(), "--help"], check=True,
                           stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
        worst = max(worst, max(times))
        print(f"blendrag {command + ' ' if command else ''}--help: median "
              f"{statistics.median(times):.2f} s, max {max(times):.2f} s over {args.runs} runs")
    print(f"slowest: {worst:.2f} s (target < 1 s): {'PASS' if worst < 1 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
