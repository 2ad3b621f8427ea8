"""The quality runner end to end on a tiny random model, and its aggregation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blendrag.config import BlendConfig
from blendrag_bench.datasets import EvalItem, load_synthetic
from blendrag_bench.quality import RECORD_KEYS, ExampleResult, QualityConfig, run_quality, summarize
from blendrag_bench.report import records, write_report

FULL, BLEND1 = BlendConfig(mode="full"), BlendConfig(mode="blend", selector="cacheblend", ratio=1.0)
CONFIG = QualityConfig(modes=("full", "blend"), selectors=("cacheblend",), ratios=(0.2, 1.0),
                       max_new_tokens=3,
                       warmup=False, max_chunk_tokens=None)


@pytest.fixture(scope="module")
def report(engine_for):
    too_long = EvalItem("p ", ("many words " * 600,), "q?", ("a",), "long")
    items = [too_long] + load_synthetic(2, num_chunks=(2, 3))
    return run_quality(items, CONFIG, engine=engine_for("llama"), dataset="synthetic")


def _summary(report, mode: str, ratio: float | None = None):
    return next(s for s in report.summaries if s.mode == mode and s.ratio == ratio)


def test_runs_every_config_on_every_fitting_item(report) -> None:
    assert report.items == 2 and report.skipped == 1
    assert [s.label for s in report.summaries] == ["full", "blend-cacheblend@0.2",
                                                   "blend-cacheblend@1"]
    assert len(report.examples) == 2 * 3
    assert all(s.n == 2 for s in report.summaries)
    assert all(0.0 <= e.quality <= 1.0 and e.ttft_s > 0 for e in report.examples)


def test_full_agrees_with_itself(report) -> None:
    full = _summary(report, "full")
    assert full.first_token_agreement == 1.0 and full.kl == 0.0
    assert full.same_answer == 1.0 and full.answer_kl == 0.0
    assert full.speedup_vs_full == 1.0 and full.recompute_fraction == 1.0
    assert full.selector is None and full.ratio is None


def test_blend_at_ratio_one_matches_full(report) -> None:
    blend = _summary(report, "blend", 1.0)
    assert blend.first_token_agreement == 1.0
    assert blend.kl == pytest.approx(0.0, abs=1e-6)
    # the whole answer, teacher-forced on full's tokens, not only its first token
    assert blend.same_answer == 1.0 and blend.answer_kl == pytest.approx(0.0, abs=1e-6)
    answers = {(e.item, e.config): e.answer for e in report.examples}
    assert all(answers[(i, BLEND1)] == answers[(i, FULL)] for i in range(report.items))
    partial = _summary(report, "blend", 0.2)
    assert partial.recompute_fraction < 1.0 and partial.kl >= 0.0 and partial.answer_kl >= 0.0


def test_json_records_have_exactly_the_keys(report, tmp_path: Path) -> None:
    paths = write_report(report, tmp_path / "out", tmp_path / "q.json")
    loaded = json.loads(paths["json"].read_text())
    assert loaded == records(report)
    assert all(set(r) == set(RECORD_KEYS) == {"mode", "selector", "ratio", "same_answer",
                                              "answer_kl", "quality", "exact_match",
                                              "first_token_agreement", "kl", "ttft_s",
                                              "speedup_vs_full",
                                              "recompute_fraction", "compute_fraction", "n",
                                              "quality_by_kind"}
               for r in loaded)
    # the per-kind quality the Markdown and CSV show, in the JSON too
    assert [r["quality_by_kind"] for r in loaded] == [s.quality_by_kind
                                                      for s in report.summaries]
    assert [(r["mode"], r["selector"], r["ratio"]) for r in loaded] == [
        ("full", None, None), ("blend", "cacheblend", 0.2), ("blend", "cacheblend", 1.0)]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["compute_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        paths["csv"]
        .read_text()
        .splitlines()[0]
        .startswith("mode,selector,ratio,same_answer,answer_kl,quality,exact_match")
    )
    assert len(paths["csv"].read_text().splitlines()) == 1 + 3
    assert "| mode | selector |" in paths["md"].read_text()


def test_no_item_fits(engine_for) -> None:
    item = EvalItem("p ", ("many words " * 600,), "q?", ("a",), "long")
    with pytest.raises(ValueError, match="fits"):
        run_quality([item], CONFIG, engine=engine_for("llama"))


def _example(item: int, cfg: BlendConfig, ttft: float, quality: float, kind: str) -> ExampleResult:
    return ExampleResult(item=item, kind=kind, config=cfg, answer="", same_answer=float(item != 1),
                         answer_kl=0.2 * item, quality=quality,
                         exact_match=float(quality == 1),
                         first_token_agreement=1.0, kl=0.1 * item, ttft_s=ttft,
                         recompute_fraction=0.5)


def test_summarize_medians_and_speedup() -> None:
    blend = BlendConfig(mode="blend", selector="epic", ratio=0.1)
    rows = [
        _example(i, FULL, t, 1.0, k)
        for i, (t, k) in enumerate([(1.0, "a"), (3.0, "b"), (2.0, "a")])
    ]
    rows += [_example(i, blend, t, q, k) for i, (t, q,
                                                 k) in enumerate([(0.5, 0.0, "a"), (1.5, 1.0, "b"),
                                                                          (1.0, 0.5, "a")])]
    full, b = summarize(rows, [FULL, blend])
    assert full.ttft_s == 2.0 and full.speedup_vs_full == 1.0
    assert b.ttft_s == 1.0 and b.speedup_vs_full == 2.0  # median 2.0 / median 1.0
    assert b.quality == pytest.approx(0.5) and b.exact_match == pytest.approx(1 / 3)
    assert b.same_answer == pytest.approx(2 / 3) and b.answer_kl == pytest.approx(0.2)
    assert b.kl == pytest.approx(0.1) and b.quality_by_kind == {"a": 0.25, "b": 1.0}
    assert (b.selector, b.ratio, b.label) == ("epic", 0.1, "blend-epic@0.1")


def test_quality_config_validation() -> None:
    default = QualityConfig()
    assert len(default.configs()) == 3 + 6 * 6
    assert default.configs()[0] == FULL and default.model_name == "smollm2-135m-instruct"
    assert QualityConfig(modes=("blend",), selectors=("epic",), ratios=(0.5,)).configs()[0] == FULL
    for bad in (dict(modes=("fast",)), dict(modes=()), dict(selectors=("best",)),
                dict(ratios=(0.0,)),
                dict(ratios=(1.5,)), dict(max_new_tokens=0), dict(ingest_order="random"),
                dict(profile_neighbours=0), dict(max_chunk_tokens=0)):
        with pytest.raises(ValueError):
            QualityConfig(**bad)


@pytest.mark.parametrize("order", ["prompt", "shuffled"])
def test_profile_runs_ingest_profiles_in_the_chosen_order(engine_for, order) -> None:
    """Profiles come from ingestion (none measured at query time); the order decides the
    neighbour: prompt order measures each chunk after its prompt predecessor."""
    from blendrag.engine.caches.profile import key_deviation

    engine = engine_for("llama")
    item = load_synthetic(1, num_chunks=(4, 4))[0]
    config = QualityConfig(modes=("full", "blend"), selectors=("profile",), ratios=(0.3,),
                           max_new_tokens=2,
                           warmup=False, ingest_order=order, seed=3)
    report = run_quality([item], config, engine=engine)
    assert report.ingest_order == order and [s.label for s in report.summaries] == [
        "full",
        "blend-profile@0.3",
    ]
    layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
    anchor, ids = list(layout.chunk_prefix_ids), layout.chunk_ids
    after_prev = [key_deviation(engine.runner.compute_chunk(None, anchor, c),
                                engine.runner.compute_chunk(None, anchor + list(ids[i - 1]),
                                                      c)) for i, c in enumerate(ids)]
    stored = [engine.store.get(engine.key(anchor, c)).profile for c in ids]
    same = [
        bool(s is not None and a.shape == s.shape and (a - s).abs().max() < 1e-3)
        for a, s in zip(after_prev, stored)
    ]
    if order == "prompt":
        assert all(same)
    else:
        assert not all(same)
    assert engine.prefill(layout, config.configs()[1]).stats.cache.profiles_computed == 0


def test_profile_neighbours_reach_ingestion_and_the_report(engine_for) -> None:
    import torch

    from blendrag.engine.caches.profile import key_deviation
    from blendrag_bench.report import format_markdown

    engine = engine_for("llama")
    item = load_synthetic(1, num_chunks=(4, 4))[0]
    config = QualityConfig(modes=("full", "blend"), selectors=("profile",), ratios=(0.3,),
                           max_new_tokens=2,
                           warmup=False, profile_neighbours=2)
    report = run_quality([item], config, engine=engine)
    assert report.profile_neighbours == 2
    assert (
        "after each chunk's 2 predecessors (largest deviation kept) in prompt order"
        in format_markdown(report)
    )
    layout = engine.build_prompt(item.prefix, item.chunks, item.suffix)
    anchor, ids = list(layout.chunk_prefix_ids), layout.chunk_ids
    alone = engine.runner.compute_chunk(None, anchor, ids[2])
    devs = [
        key_deviation(alone, engine.runner.compute_chunk(None, anchor + list(ids[j]), ids[2]))
        for j in (1, 0)
    ]
    stored = engine.store.get(engine.key(anchor, ids[2])).profile
    assert torch.allclose(stored, torch.maximum(*devs), rtol=1e-3, atol=1e-4)
