"""Whole-answer fidelity (blendrag.eval.answer): greedy answers with their logits, teacher
forcing that resumes after the first difference, and the answer KL."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, PromptLayout
from blendrag.engine.caches.context import ChunkContext
from blendrag.eval.answer import (
    answer_kl,
    compare_answers,
    forced_logits,
    greedy_answer,
    same_answer,
)

FULL = BlendConfig(mode="full")


@pytest.fixture(scope="module")
def engine(engine_for):
    # the default ingestion context: reuse differs from full, so the answers part ways
    return engine_for("llama", context=ChunkContext())


@pytest.fixture(scope="module")
def layout(engine):
    layout = engine.build_prompt("Read: ", ["alpha beta gamma. ", "delta epsilon zeta. ",
                                            "eta theta iota kappa. "], "Question: what? Answer:")
    engine.precompute(layout.chunk_prefix_ids, list(layout.chunk_ids))
    return layout


def _logits_after(engine, layout: PromptLayout, tokens: tuple[int, ...]) -> torch.Tensor:
    """The full prefill's logits for the token after ``layout`` + ``tokens``: a fresh prefill of
    the longer prompt, nothing shared with the code under test."""
    longer = PromptLayout(layout.prefix_ids, layout.chunk_ids, layout.suffix_ids + tokens)
    return engine.prefill(longer, FULL).logits


def test_greedy_answer_keeps_the_logits_of_every_token(engine, layout) -> None:
    pre = engine.prefill(layout, FULL, extra_capacity=6)
    answer = greedy_answer(engine, pre, 6, first_line=False)
    assert 1 <= len(answer.token_ids) <= 6 and answer.logits.shape[0] == len(answer.token_ids)
    for t, token in enumerate(answer.token_ids):
        assert int(answer.logits[t].argmax()) == token
        expected = _logits_after(engine, layout, answer.token_ids[:t])
        torch.testing.assert_close(answer.logits[t], expected, atol=1e-4, rtol=1e-4)
    # and the same text as the engine's own generate()
    from blendrag import GenerationConfig
    out = engine.generate(layout, FULL, GenerationConfig(max_new_tokens=6))
    assert out.token_ids == [t for t in answer.token_ids if t not in engine.eos_token_ids]


def test_forced_logits_decode_the_reference_tokens_after_any_prefill(engine, layout) -> None:
    full = greedy_answer(engine, engine.prefill(layout, FULL, extra_capacity=6), 6)
    pre = engine.prefill(layout, BlendConfig(mode="reuse"), extra_capacity=6)
    own = greedy_answer(engine, pre, 6)
    forced = forced_logits(engine, pre, own, full.token_ids)
    assert forced.shape == full.logits.shape
    # the same rows a reuse request computes for each prefix of full's answer, from scratch
    for t in range(len(full.token_ids)):
        longer = PromptLayout(layout.prefix_ids, layout.chunk_ids,
                              layout.suffix_ids + full.token_ids[:t])
        expected = engine.prefill(longer, BlendConfig(mode="reuse")).logits
        torch.testing.assert_close(forced[t], expected, atol=1e-4, rtol=1e-4)


def test_forced_logits_of_a_prefill_on_its_own_answer_are_its_own(engine, layout) -> None:
    pre = engine.prefill(layout, FULL, extra_capacity=6)
    own = greedy_answer(engine, pre, 6)
    assert torch.equal(forced_logits(engine, pre, own, own.token_ids), own.logits)
    with pytest.raises(ValueError, match="at least one token"):
        forced_logits(engine, pre, own, ())


def test_answer_kl_is_the_mean_of_the_per_token_divergences() -> None:
    p = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    log_p, log_q = torch.log_softmax(p[0].double(), 0), torch.log_softmax(q[0].double(), 0)
    first = float((log_p.exp() * (log_p - log_q)).sum())
    assert answer_kl(p, q) == pytest.approx(first / 2)  # the second row diverges by 0
    assert answer_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="shape"):
        answer_kl(p, q[:1])


def test_same_answer_compares_normalized_text() -> None:
    assert same_answer("The Eiffel Tower.", "eiffel  tower")
    assert not same_answer("Paris, France", "Paris")


def test_compare_answers_against_the_first_config(engine, layout) -> None:
    configs = [FULL, BlendConfig(selector="cacheblend", ratio=1.0), BlendConfig(mode="reuse")]
    full, exact, reuse = compare_answers(engine, layout, configs, 5)
    assert [c.config for c in (full, exact, reuse)] == configs
    assert full.same_answer and full.answer_kl == 0.0 and full.first_token_kl == 0.0
    assert exact.same_answer and exact.answer_kl == pytest.approx(0.0, abs=1e-6)
    assert exact.answer.token_ids == full.answer.token_ids
    pre = engine.prefill(layout, BlendConfig(mode="reuse"), extra_capacity=5)
    own = greedy_answer(engine, pre, 5)
    assert own.token_ids == reuse.answer.token_ids
    expected = answer_kl(full.answer.logits, forced_logits(engine, pre, own,
                                                           full.answer.token_ids))
    assert reuse.answer_kl == pytest.approx(expected, rel=1e-5) and reuse.answer_kl > 0
    assert reuse.stats.mode == "reuse"
    with pytest.raises(ValueError, match="reference"):
        compare_answers(engine, layout, [], 5)


def test_compared_configs_run_as_asked_whatever_the_loading_config(engine_for):
    """An engine that may run a request as a full prefill instead (a GPU's cost profile,
    ``full_when_faster``; chunks in no store, ``full_when_missing``) would have each blend row
    of a comparison measure a full prefill's answer, and a calibration choose a ratio from it:
    compare_answers runs every config in its own mode, and leaves the loading config as it
    was."""
    from blendrag.engine.selection.controller import LoadingConfig

    loading = LoadingConfig(full_when_faster=True, full_when_missing=0.5)
    engine = engine_for("llama", context=ChunkContext(), loading=loading)
    layout = engine.build_prompt("Read: ", ["alpha beta gamma. ", "delta epsilon zeta. "],
                                 "Question: what? Answer:")  # its chunks in no store
    configs = [FULL, BlendConfig(selector="epic", ratio=0.3), BlendConfig(mode="reuse")]
    out = compare_answers(engine, layout, configs, 4)
    assert [c.stats.mode for c in out] == ["full", "blend", "reuse"]
    assert engine.loading == loading


def test_every_config_prefills_in_the_pooled_buffer(engine, layout, monkeypatch) -> None:
    """Each config's TTFT is taken in the same conditions: a config whose Prefill the loop
    still held made the next one allocate a buffer of its own (every second config's TTFT,
    in bench quality, fidelity and calibration)."""
    from helpers.recorders import pooled_prefills

    pooled = pooled_prefills(monkeypatch)
    configs = [FULL, BlendConfig(mode="reuse"), BlendConfig(ratio=0.3),
               BlendConfig(selector="epic", ratio=0.3)]
    compare_answers(engine, layout, configs, max_new_tokens=3)
    assert len(pooled) >= len(configs) and all(pooled), pooled
