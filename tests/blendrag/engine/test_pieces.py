"""A long prefill in pieces (engine/compute/pieces.py, chunked prefill): the first-token logits
and the request KV of a pass run in pieces match the pass run whole (fp32, 1e-4 and 1e-5), for
full prefill, reuse and blend falling back to full; its per-layer counts are those of one pass;
``between()`` runs once between two pieces; the passes that cannot split (blend's selector,
APE, other observers, short ones) run whole; a served prefill in pieces decodes the running
requests between its pieces and answers as alone."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.config import Ape
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.compute.observers import CapturedRows, LayerCounts
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.serving import Scheduler, ServingConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

MODES = {
    "full": BlendConfig(mode="full"),
    "reuse": BlendConfig(mode="reuse"),
    "prefix": BlendConfig(mode="prefix"),
}


@pytest.mark.parametrize("family", ["llama", "gemma2"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_pass_in_pieces_equals_the_pass_whole(engine_for, family, mode):
    engine = engine_for(family)
    engine.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    whole = engine.prefill(layout, MODES[mode])
    calls = []
    pieces = PrefillPieces(16, lambda: calls.append(1))
    cut = engine.stream(layout, MODES[mode], GenerationConfig(max_new_tokens=1),
                        pieces=pieces).prefill
    computed = whole.stats.compute.computed_per_layer
    assert len(calls) == -(-computed[0] // 16) - 1 >= 1 or computed[0] <= 16
    assert torch.allclose(cut.logits, whole.logits, atol=1e-4, rtol=0)
    n = whole.fused.length
    assert cut.fused.length == n
    assert torch.allclose(cut.fused.k[:, :, :n], whole.fused.k[:, :, :n], atol=1e-5, rtol=0)
    assert torch.allclose(cut.fused.v[:, :, :n], whole.fused.v[:, :, :n], atol=1e-5, rtol=0)
    assert cut.stats.compute.computed_per_layer == computed
    assert cut.stats.compute.attended_keys_per_layer == \
        whole.stats.compute.attended_keys_per_layer


def test_passes_that_cannot_split_run_whole(engine_for):
    engine = engine_for("llama")
    ids = torch.arange(100)
    pieces = PrefillPieces(16, lambda: None)
    assert pieces.spans(LoopPlan(ids, torch.arange(100)), ()) is not None
    assert len(pieces.spans(LoopPlan(ids, torch.arange(60, 100)), ()) or []) == 3
    assert pieces.spans(LoopPlan(ids, torch.arange(90, 100)), ()) is None  # short
    assert pieces.spans(LoopPlan(ids, torch.arange(100)), (CapturedRows(),)) is None
    assert pieces.spans(LoopPlan(ids, torch.arange(100)), (LayerCounts((0, 1)),)) is not None
    scattered = torch.cat([torch.arange(0, 40), torch.arange(60, 100)])
    assert pieces.spans(LoopPlan(ids, scattered), ()) is None  # not one run
    # blend's selector chooses among every computed token at once: whole
    engine.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    calls = []
    for config in (BlendConfig(mode="blend", ratio=0.5, selector="cacheblend"),
                   BlendConfig(mode="reuse", ape=Ape())):
        engine.stream(layout, config, GenerationConfig(max_new_tokens=1),
                      pieces=PrefillPieces(16, lambda: calls.append(1)))
    assert calls == []
    with pytest.raises(ValueError, match=">= 16 tokens"):
        PrefillPieces(8, lambda: None)


def test_a_served_prefill_in_pieces_decodes_the_others_between_them(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    short = engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX)
    long = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    gen = GenerationConfig(max_new_tokens=24, eos_token_ids=())
    want = [engine.generate(lay, BlendConfig(mode="full"), gen).token_ids
            for lay in (short, long)]
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0,
                                                       prefill_piece_tokens=16))
    real = scheduler._between  # noqa: SLF001 (watched, not changed)
    decoded: list[int] = []

    def watched() -> None:
        before = scheduler.stats.decoded
        real()
        decoded.append(scheduler.stats.decoded - before)

    scheduler._between = watched  # noqa: SLF001
    first = scheduler.submit(engine, short, BlendConfig(mode="full"), gen)
    reading = iter(first)  # kept: an iterator dropped before the end cancels its request
    next(reading)  # decoding now
    second = scheduler.submit(engine, long, BlendConfig(mode="full"), gen)
    assert [first.wait(60).token_ids, second.wait(60).token_ids] == want
    # the long prompt's ~10 pieces: the first request decoded a token between two of them
    assert len(decoded) >= 5 and sum(decoded) >= 5
    scheduler.close()
