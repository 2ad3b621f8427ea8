"""The engine's CPU threads: its own count while it computes (prefill, each decoded token,
ingestion), the caller's count back after every call, torch's setting untouched with None."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from blendrag.engine.compute.observers import LayerObserver
from blendrag.engine.compute.threads import DEFAULT_THREADS, torch_threads
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


class _Threads(LayerObserver):
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def on_layer(self, step) -> None:
        self.seen.add(torch.get_num_threads())


@pytest.fixture
def caller_threads():
    """The caller runs with 3 threads (any count other than the engine's); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


def _engine(model_dir, **kw) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, **kw)


def test_prefill_runs_on_the_engines_threads_and_gives_the_callers_back(model_dir,
                                                                         caller_threads):
    engine = _engine(model_dir)
    assert engine.threads == DEFAULT_THREADS == 1
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    watch = _Threads()
    engine.prefill(layout, BlendConfig(mode="full"), observers=[watch])
    assert watch.seen == {1}
    assert torch.get_num_threads() == caller_threads


def test_each_decoded_token_runs_on_the_engines_threads_and_the_caller_keeps_its_own(
        model_dir, caller_threads, monkeypatch):
    engine = _engine(model_dir, threads=2)
    seen: list[int] = []
    decode = engine.runner.decode

    def watched(token, fused):
        seen.append(torch.get_num_threads())
        return decode(token, fused)

    monkeypatch.setattr(engine.runner, "decode", watched)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    between = []
    stream = engine.stream(layout, BlendConfig(ratio=0.2),
                           GenerationConfig(max_new_tokens=6, eos_token_ids=()))
    for _ in stream:
        between.append(torch.get_num_threads())  # the caller's code between tokens
    assert seen and set(seen) == {2}
    assert set(between) == {caller_threads} and torch.get_num_threads() == caller_threads


def test_ingestion_runs_on_the_engines_threads(model_dir, caller_threads):
    engine = _engine(model_dir)
    seen: list[int] = []
    engine.ingest(PASSAGES[:2], PREFIX,
                  on_chunk=lambda i, computed: seen.append(torch.get_num_threads()))
    assert seen == [1, 1] and torch.get_num_threads() == caller_threads


def test_none_leaves_torchs_setting_alone(model_dir, caller_threads):
    engine = _engine(model_dir, threads=None)
    watch = _Threads()
    engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX), observers=[watch])
    assert watch.seen == {caller_threads}


def test_the_count_is_restored_when_the_call_fails(caller_threads):
    with pytest.raises(RuntimeError), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == caller_threads


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_count_is_a_clear_error(model_dir, bad):
    with pytest.raises(ValueError, match="threads must be a count >= 1, or None"):
        _engine(model_dir, threads=bad)


def test_auto_is_one_thread_on_a_cpu_and_torchs_own_count_on_a_gpu(model_dir):
    """The default, "auto": ``DEFAULT_THREADS`` for an engine on a CPU; on a GPU None (torch's
    own count: its CPU work is host copies). A count or None given is kept on either."""
    from blendrag.engine.compute.threads import engine_threads

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert engine_threads("auto", cpu) == DEFAULT_THREADS == 1
    assert engine_threads("auto", gpu) is None
    assert engine_threads(3, gpu) == 3 and engine_threads(None, cpu) is None
    assert _engine(model_dir, threads="auto").threads == 1
    with pytest.raises(ValueError, match='or "auto"'):
        engine_threads("all", cpu)


def test_the_layer_feeds_reader_takes_the_engines_count(model_dir, caller_threads,
                                                        monkeypatch, tmp_path):
    """Threads an engine's call starts run with the count in effect: the layer feed's reader,
    which copies host rows for a GPU, copies with the engine's threads (why "auto" leaves
    torch's own count on a GPU)."""
    from blendrag.engine.compute.fused_kv import FusedKV
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.store import StoreConfig, TieredKVStore

    engine = _engine(model_dir, threads=2,
                     loading=LoadingConfig(prefetch_layers=2, full_when_faster=False))
    engine.store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path))
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)
    seen: list[tuple[str, int]] = []
    place = FusedKV.place

    def watched(self, *args, **kw):
        import threading

        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return place(self, *args, **kw)

    monkeypatch.setattr(FusedKV, "place", watched)
    pre = engine.prefill(layout, BlendConfig(mode="reuse"))
    assert pre.stats.loading.pipelined
    assert seen and {name for name, _ in seen} == {"blendrag-layer-feed"}
    assert {count for _, count in seen} == {2}
    assert torch.get_num_threads() == caller_threads
