"""Warm-up at load (engine/request/warmup.py) and the compile cache it keeps
(engine/compute/compile_cache.py)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.engine.compute import compile_cache
from blendrag.engine.request.warmup import WarmupConfig, synthetic_layout, warm_up
from blendrag.store.ram import MemoryKVStore
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

SMALL = WarmupConfig(prompt_tokens=(96, 160), chunks=3, suffix_tokens=8, compile_cache=None)


def tiny_engine(model_dir, **settings) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=NO_CONTEXT, **settings)


def test_the_synthetic_prompt_has_the_asked_shape():
    layout = synthetic_layout(160, 3, 8, vocab=50)
    assert len(layout.ids) == 160 and len(layout.chunk_ids) == 3
    assert [len(c) for c in layout.chunk_ids] == [48, 48, 48]
    assert len(layout.suffix_ids) == 8 and len(layout.prefix_ids) == 8
    assert min(layout.ids) >= 3 and max(layout.ids) < 50
    assert synthetic_layout(160, 3, 8, vocab=50) == layout  # the same prompt every time


def test_bad_settings_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="cannot hold"):
        WarmupConfig(prompt_tokens=(20,), chunks=6, suffix_tokens=64)
    with pytest.raises(ValueError, match="at least one mode"):
        WarmupConfig(configs=())
    with pytest.raises(ValueError, match="decode_tokens"):
        WarmupConfig(decode_tokens=-1)
    with pytest.raises(ValueError, match="answer_tokens"):
        WarmupConfig(decode_tokens=8, answer_tokens=4)


def test_each_run_has_room_for_an_answer_as_a_served_request_has(model_dir):
    # a request's buffer size picks the passes captured for it on a GPU: warm-up's requests
    # are sized as one asking for ``answer_tokens`` new tokens is, the cold ones too
    engine = tiny_engine(model_dir)
    asked = []

    def prefill(layout, blend, extra):
        asked.append(extra)
        return engine.prefill(layout, blend, extra)

    config = dataclasses.replace(SMALL, prompt_tokens=(96,), configs=SMALL.configs[:1],
                                 answer_tokens=24, profile=False)
    warm_up(engine.runner, prefill, engine.model.config.vocab_size, config, settle=lambda: None)
    assert asked and set(asked) == {24}
    assert WarmupConfig().answer_tokens == GenerationConfig().max_new_tokens


def test_warm_up_runs_every_mode_cold_and_warm_and_leaves_the_store_alone(model_dir):
    store = MemoryKVStore()
    engine = tiny_engine(model_dir, store=store, prefix_cache_bytes=1 << 20)
    report = engine.warmup(SMALL)
    labels = [c.label for c in SMALL.configs]
    for n in SMALL.prompt_tokens:
        for label in labels:
            assert report.steps[f"{label} {n} cold"] > 0
            assert report.steps[f"{label} {n} warm"] > 0
    assert report.steps["profile"] > 0 and engine.runner.cost_profile is not None
    assert report.seconds >= sum(report.steps.values()) * 0.99
    assert (report.loaded, report.saved) == (0, 0)  # no compile cache asked for
    assert "warm-up" in report.summary() and "slowest" in report.summary()
    # nothing of the warm-up reached the user's store or the engine's caches
    assert store.stats().gets == 0 and store.bytes == 0
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 0
    # each cold run found its chunks in no store: they were computed off its path (the
    # default backfill), into the sandbox's store, before the warm run took them
    assert engine.cache.backfill.computed > 0 and engine.cache.backfill.wait(timeout=0)


def test_requests_after_warm_up_are_those_of_a_cold_engine(model_dir):
    cold = tiny_engine(model_dir)
    warm = tiny_engine(model_dir)
    warm.warmup(SMALL)
    layout = cold.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for engine in (cold, warm):  # each mode runs as asked (none falls back for missing chunks)
        engine.ingest(PASSAGES, prefix=PREFIX)
    for config in (BlendConfig(mode="full"), BlendConfig(mode="reuse"),
                   BlendConfig(mode="blend", selector="epic", ratio=0.3)):
        a, b = cold.prefill(layout, config), warm.prefill(layout, config)
        assert torch.equal(a.logits, b.logits), config.label
        assert a.stats.mode == b.stats.mode == config.mode


def test_an_unusable_compile_cache_is_a_cold_start(tmp_path, caplog, monkeypatch):
    folder = tmp_path / "compile"
    folder.mkdir()
    compile_cache.cache_file(folder, torch.device("cpu")).write_bytes(b"not a cache" * 10)
    with caplog.at_level(logging.WARNING):
        assert compile_cache.load(folder, torch.device("cpu")) == 0
    assert "not loaded" in caplog.text
    assert compile_cache.load(tmp_path / "none", torch.device("cpu")) == 0  # nothing kept
    # nothing compiled in this process (whatever an earlier test on this worker compiled)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    assert compile_cache.save(folder, torch.device("cpu")) == 0
    assert list(folder.iterdir()) == [compile_cache.cache_file(folder, torch.device("cpu"))]


_PROCESS = """
import sys, torch
from pathlib import Path
from torch._dynamo.utils import counters
from blendrag.engine.compute import compile_cache
folder = Path(sys.argv[1])
loaded = compile_cache.load(folder, torch.device("cpu"))
y = torch.compile(lambda x: (x * 2).sin() + 1)(torch.ones(8))
saved = compile_cache.save(folder, torch.device("cpu"))
print(loaded, saved, counters["inductor"]["fxgraph_cache_hit"], float(y.sum()))
"""


@pytest.mark.processes
def test_a_new_process_loads_what_an_earlier_one_compiled(tmp_path):
    folder = tmp_path / "compile"

    def run(n: int) -> list[str]:
        # each process with an empty Inductor cache of its own (a fresh machine): a hit can
        # only come from the kept file
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor{n}")}
        out = subprocess.run([sys.executable, "-c", _PROCESS, str(folder)], env=env,
                             capture_output=True, text=True, timeout=300, check=True)
        return out.stdout.split()

    loaded, saved, hits, y1 = run(1)
    assert (int(loaded), int(hits)) == (0, 0) and int(saved) > 0
    path = compile_cache.cache_file(folder, torch.device("cpu"))
    assert path.stat().st_size == int(saved) and list(folder.iterdir()) == [path]
    loaded, _, hits, y2 = run(2)
    assert int(loaded) == int(saved) and y1 == y2
    assert int(hits) >= 1  # the compiled graph came from the file, not from a compile


def test_the_cache_file_is_per_torch_version_and_device(tmp_path):
    path = compile_cache.cache_file(tmp_path, torch.device("cpu"))
    assert path.parent == tmp_path and torch.__version__.split("+")[0] in path.name
    assert path.name.endswith("-cpu.bin") and "/" not in path.name
    assert Path(compile_cache.DEFAULT_FOLDER).name == "compile"


def test_from_pretrained_warms_up_when_asked(model_dir):
    engine = tiny_engine(model_dir, warmup=WarmupConfig(prompt_tokens=(96,), chunks=3,
                                                        suffix_tokens=8, compile_cache=None,
                                                        configs=(BlendConfig(mode="reuse"),)))
    report = engine.warmup_report
    assert report is not None and set(report.steps) == {"profile", "reuse 96 cold",
                                                          "reuse 96 warm"}
    assert tiny_engine(model_dir).warmup_report is None  # off unless asked


def test_a_warm_run_repeats_while_its_passes_are_warming(model_dir):
    """On CUDA a static pass's shape runs the layer loop when seen once and is captured the
    second time; warm-up repeats a warm prefill until its passes replay, so that the cost
    profile (which counts no warming request) learns each mode at its steady state at load.
    Here the static pass is told to wait twice per shape, as on CUDA."""
    from blendrag import ComputeConfig
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.engine.selection.costs import DeviceCosts, PassCost

    engine = tiny_engine(model_dir, compute=ComputeConfig(passes="graph"),
                         loading=LoadingConfig(full_when_faster=True))
    costs = DeviceCosts(3, {k: PassCost(1e-6, 0, 0) for k in ("causal", "tail", "scattered")})
    engine.runner.cost_profile = costs
    passes = engine.runner.static_passes
    replay, seen = passes.run, {}

    def twice_none(plan, fused, observers=()):  # a shape seen once, then captured
        shape = (plan.active.shape[0], len(observers))
        seen[shape] = seen.get(shape, 0) + 1
        return None if seen[shape] <= 2 else replay(plan, fused, observers)

    passes.run = twice_none  # type: ignore[method-assign]
    ran = []

    def prefill(layout, blend, extra):
        pre = engine.prefill(layout, blend, extra)
        ran.append((blend.label, pre.stats.compute.warming_passes))
        return pre

    config = dataclasses.replace(SMALL, prompt_tokens=(96,), profile=False,
                                 configs=(BlendConfig(mode="reuse"),))
    warm_up(engine.runner, prefill, 50, config, settle=engine.cache.backfill.wait)
    # the cold run (its chunks in no store: a full prefill), then warming twice, then steady
    assert [w for _, w in ran] == [0, 1, 1, 0]
    assert costs._gaps["reuse"][0] == 1  # learnt from the steady run only
