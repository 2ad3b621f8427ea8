"""A batched decoding step (engine/compute/batch_decode.py) gives every request the logits of its
own step alone: fp32 within 1e-4, the same greedy tokens, for every family's attention and RoPE
(sliding windows, soft caps, per-layer RoPE tables, partial rotary, float32 RoPE), requests of
different lengths and modes side by side; models and requests it cannot batch decode alone."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig
from blendrag.engine.compute.batch_decode import decode_batch
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, decoded_alone

STEPS = 6
REQUESTS = (  # (passages, mode): different lengths, cached and computed rows
    (PASSAGES, BlendConfig(mode="full")),
    (PASSAGES[:2], BlendConfig(mode="blend", ratio=0.3)),
    (PASSAGES[1:], BlendConfig(mode="reuse")),
)


def _prefills(engine):
    out = []
    for passages, config in REQUESTS:
        layout = engine.build_prompt(PREFIX, passages, SUFFIX)
        out.append(engine.prefill(layout, config, extra_capacity=STEPS + 1))
    return out


def _greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def _alone(engine) -> list[list[torch.Tensor]]:
    """Each request's logits decoded on its own, step by step (greedy)."""
    return decoded_alone(engine, _prefills(engine), STEPS)


def _batched(engine) -> list[list[torch.Tensor]]:
    pres = _prefills(engine)
    tokens = [_greedy(pre.logits) for pre in pres]
    runs: list[list[torch.Tensor]] = [[] for _ in pres]
    for _ in range(STEPS):
        out = engine.runner.decode_many(tokens, [pre.fused for pre in pres])
        for j, row in enumerate(out):
            runs[j].append(row)
        tokens = [_greedy(row) for row in out]
    return runs


FAMILIES = {
    "llama": {}, "mistral": {"sliding_window": 24}, "qwen3": {}, "gemma2": {},
    "gemma3": {}, "phi3": {}, "olmo2": {},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_batched_step_gives_each_request_its_own_logits(engine_for, family):
    engine = engine_for(family, **FAMILIES[family])
    alone, together = _alone(engine), _batched(engine)
    for mine, theirs in zip(alone, together):
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
            assert _greedy(a) == _greedy(b)


def test_dynamic_rope_decodes_each_request_alone(engine_for):
    engine = engine_for("llama", rope={"rope_type": "dynamic", "factor": 2.0})
    calls = []
    real = engine.runner.decode
    engine.runner.decode = lambda token, fused: calls.append(token) or real(token, fused)
    alone = _alone(engine)
    calls.clear()
    together = _batched(engine)
    assert len(calls) == STEPS * len(REQUESTS)  # none batched: frequencies change with length
    for mine, theirs in zip(alone, together):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)


def test_requests_never_read_each_others_rows(engine_for):
    """A request's logits do not change with what the others in its step hold."""
    engine = engine_for("llama")
    pres = _prefills(engine)
    first = [_greedy(pre.logits) for pre in pres]
    base = engine.runner.decode_many(first[:1] + first[1:], [p.fused for p in pres])[0]
    pres = _prefills(engine)
    for pre in pres[1:]:  # garbage in the other requests' rows
        pre.fused.k.normal_()
        pre.fused.v.normal_()
    again = engine.runner.decode_many(first, [p.fused for p in pres])[0]
    assert torch.allclose(base, again, atol=1e-5, rtol=0)


def test_bad_batches_are_refused(engine_for):
    engine = engine_for("llama")
    pre = _prefills(engine)[0]
    with pytest.raises(ValueError, match="one token per request KV"):
        decode_batch(engine.runner.adapter, "sdpa", [1, 2], [pre.fused])
    with pytest.raises(ValueError, match="share a request KV"):
        decode_batch(engine.runner.adapter, "sdpa", [1, 2], [pre.fused, pre.fused])
    pre.fused.length = pre.fused.capacity
    with pytest.raises(ValueError, match="full"):
        decode_batch(engine.runner.adapter, "sdpa", [1], [pre.fused])
