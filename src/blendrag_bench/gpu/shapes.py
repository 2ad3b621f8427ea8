"""The workloads of the GPU check: Mistral-7B's shape with random weights in bfloat16 (what
users run), or a tiny shape that checks the script itself on a CPU (``--small``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from blendrag_bench.ttft import TTFTWorkload

SEVEN_B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336)
TINY = dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256)
RATIOS = (0.15, 0.20)  # the fastest blend at 15 % and the default (preview at 20 %)


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def workload(small: bool, prompt: str, **kw) -> TTFTWorkload:
    """``prompt``: ``3k`` (6 x 512 tokens of chunks) or ``16k`` (8 x 2,048)."""
    chunks, tokens = {"3k": (6, 512), "16k": (8, 2048)}[prompt]
    if small:
        chunks, tokens = {"3k": (3, 128), "16k": (4, 256)}[prompt]
    dev = device()
    # small: the default and the fastest static selector only (the script, not the figures)
    selectors = ("preview", "epic") if small else ("preview", "cacheblend", "profile", "epic")
    base = TTFTWorkload(**(TINY if small else SEVEN_B), chunks=chunks, chunk_tokens=tokens,
                        ratios=RATIOS, selectors=selectors, repeats=1 if small else 3,
                        dtype="bfloat16" if dev == "cuda" else "float32", device=dev)
    return replace(base, **kw)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
