"""Each stored format's KL against the uncompressed KV (bench store --kl-items), on a tiny model."""

from __future__ import annotations

import math

from blendrag import BlendConfig
from blendrag.store.config import KV_FORMATS
from blendrag_bench.format_kl import kl_vs_uncompressed
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def test_the_exact_format_is_zero_and_every_lossy_one_measured(engine_for, one_thread):
    engine = engine_for("llama", layers=3)
    layouts = [engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
               engine.build_prompt(PREFIX, PASSAGES[::-1], SUFFIX)]
    kl = kl_vs_uncompressed(engine, layouts, BlendConfig(selector="cacheblend", ratio=0.3))
    assert set(kl) == set(KV_FORMATS)
    assert kl["model"] == 0.0  # the same rows, bit for bit
    # the lossy formats move the distribution, a little: float16's 10-bit mantissa least
    assert all(math.isfinite(v) and 0.0 < v < 0.05 for f, v in kl.items() if f != "model")
    assert kl["float16"] < kl["bfloat16"] and kl["float16"] < kl["int8"]
