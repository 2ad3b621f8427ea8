"""The cross-tenant timing measurement, shared by its test and by scripts/tenant_timing.py
(which prints the figures docs/benchmarks.md cites): three arms of request times for tenant B
over fresh passages, interleaved in a shuffled order so that drift in the machine's load (and
whatever one request leaves for the next) falls on all three alike. The arms' prompts are the
same length, token for token: a passage labelled "nobodys" ran two tokens longer than one
labelled "theirs", and the KS test saw those two tokens (1 %) as a leak under load."""

from __future__ import annotations

import math
import random
import time

import numpy as np

from blendrag import BlendConfig
from helpers.tiny import PREFIX, SUFFIX

BLEND = BlendConfig(ratio=0.2)
WORDS = "river stone castle orbit meadow lantern copper violin harbor glacier".split()
LABELS = {"theirs": "a", "nobodys": "b", "mine": "c"}  # one token each in the test tokenizer


def passage(i: int, kind: str) -> str:
    return f"{LABELS[kind]} {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)]
                                               for j in range(40))


def _same_length(engine, i: int, kinds: list[str]) -> None:
    """The arms differ in who cached the passage, never in how many tokens a request runs."""
    lengths = {k: engine.build_prompt(PREFIX, [passage(i, k)], SUFFIX).num_tokens for k in kinds}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"sample {i}: the arms' prompts differ in length {lengths}; a timing "
                         f"test would measure the length, not the cache")


def _ttft(engine, text: str) -> float:
    layout = engine.build_prompt(PREFIX, [text], SUFFIX)
    t0 = time.perf_counter()
    engine.prefill(layout, BLEND)
    return time.perf_counter() - t0


def arms(a, b, samples: int) -> tuple[list[float], list[float], list[float]]:
    """Seconds of tenant ``b``'s requests for (what tenant ``a`` cached, what no one cached,
    what ``b`` cached itself: the positive control); ``a`` and ``b``: one engine's views."""
    arms_: dict[str, list[float]] = {"theirs": [], "nobodys": [], "mine": []}
    order = random.Random(0)
    for i in range(samples):
        a.ingest([passage(i, "theirs")])  # cached by tenant A only
        b.ingest([passage(i, "mine")])  # cached by tenant B itself
        kinds = list(arms_)
        _same_length(b, i, kinds)
        order.shuffle(kinds)  # no arm always runs first, or right after another one
        for kind in kinds:
            arms_[kind].append(_ttft(b, passage(i, kind)))
    return arms_["theirs"], arms_["nobodys"], arms_["mine"]


def ks(x: list[float], y: list[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and its asymptotic p-value."""
    xs, ys = np.sort(x), np.sort(y)
    grid = np.concatenate([xs, ys])
    d = float(np.max(np.abs(np.searchsorted(xs, grid, side="right") / len(xs)
                            - np.searchsorted(ys, grid, side="right") / len(ys))))
    n = len(xs) * len(ys) / (len(xs) + len(ys))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(max(p, 0.0), 1.0)
