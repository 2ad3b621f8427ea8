"""The first question on new documents (engine/caches/backfill.py): a request whose chunks are
mostly in no store runs an exact full prefill, its missing pieces are computed and stored off
its path, and the next request over them hits every chunk."""

from __future__ import annotations

import logging

import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.engine.selection.controller import LoadingConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

BLEND = BlendConfig(selector="epic", ratio=0.3)
FULL = BlendConfig(mode="full")


def engine_for(model_dir, **loading) -> BlendEngine:
    """The tiny Llama with the default loading config unless told otherwise."""
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=NO_CONTEXT, loading=LoadingConfig(**loading))


def test_on_by_default_at_half_the_chunk_tokens(model_dir):
    assert LoadingConfig().full_when_missing == 0.5
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         context=NO_CONTEXT)  # no loading config given
    pre = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX), BLEND)
    assert pre.stats.mode == "full" and pre.stats.cache.backfilled == len(PASSAGES) + 1


def test_the_warning_says_what_happened_in_numbers_once(model_dir, caplog):
    engine = engine_for(model_dir)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    tokens = sum(map(len, layout.chunk_ids))
    with caplog.at_level(logging.INFO, logger="blendrag.engine"):
        engine.prefill(layout, BLEND)
        engine.prefill(layout, BLEND)  # its pieces queued already (or stored meanwhile)
    said = [r for r in caplog.records if "in no store yet" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING
    assert all(r.levelno == logging.INFO for r in said[1:])  # once per engine at WARNING
    n = len(PASSAGES)
    assert (f"{BLEND.label} request: {tokens} of {tokens} chunk tokens (100 %, {n} of {n} chunks)"
            in said[0].getMessage())
    assert "at least the 50 %" in said[0].getMessage()
    assert f"{n + 1} of {n + 1} missing pieces (chunks, prefix) queued" in said[0].getMessage()


def test_new_passages_run_a_full_prefill_and_are_stored_for_the_next_request(model_dir):
    engine = engine_for(model_dir)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    full = engine_for(model_dir).prefill(layout, FULL)
    first = engine.prefill(layout, BLEND)
    assert torch.equal(first.logits, full.logits)  # exact: a full prefill ran
    s = first.stats
    assert s.mode == "full" and s.cache.backfilled == len(PASSAGES) + 1  # and the prefix
    choice = s.controller.mode
    assert choice is not None and (choice.asked, choice.ran, choice.reason) == (
        BLEND.label, "full", "chunks missing")
    assert engine.cache.backfill.wait(timeout=120)
    assert engine.cache.backfill.computed == len(PASSAGES) + 1
    second = engine.prefill(layout, BLEND)
    assert second.stats.mode == "blend" and second.stats.cache.chunk_hits == len(PASSAGES)
    assert second.stats.cache.backfilled == 0 and second.stats.controller.mode is None
    # the same rows as chunks ingested beforehand
    ingested = engine_for(model_dir)
    ingested.ingest(PASSAGES, prefix=PREFIX)
    assert torch.equal(ingested.prefill(layout, BLEND).logits, second.logits)


def test_a_few_missing_chunks_are_computed_in_the_request(model_dir):
    engine = engine_for(model_dir)
    engine.ingest(PASSAGES[:3], prefix=PREFIX)  # one of four missing: under half the tokens
    pre = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX), BLEND)
    c = pre.stats.cache
    assert pre.stats.mode == "blend" and (c.chunk_hits, c.chunk_misses, c.backfilled) == (3, 1, 0)


def test_off_every_missing_chunk_is_computed_first(model_dir):
    engine = engine_for(model_dir, full_when_missing=None)
    pre = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX), BLEND)
    assert pre.stats.mode == "blend" and pre.stats.cache.chunk_misses == len(PASSAGES)
    assert pre.stats.cache.backfilled == 0


def test_a_piece_that_fails_to_compute_is_logged_and_the_request_unharmed(model_dir, caplog,
                                                                         monkeypatch):
    engine = engine_for(model_dir)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(engine.cache, "kv", broken)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with caplog.at_level(logging.WARNING):
        pre = engine.prefill(layout, BLEND)
        assert engine.cache.backfill.wait(timeout=60)
    assert pre.stats.mode == "full" and engine.cache.backfill.failed == len(PASSAGES) + 1
    assert "could not be computed and stored" in caplog.text


def test_a_piece_is_queued_once_and_the_queue_is_bounded():
    import threading

    from blendrag.engine.caches.backfill import Backfill, Piece

    gate = threading.Event()

    class Slow:
        def kv(self, *args, **kwargs):
            gate.wait(10)

    backfill, cache = Backfill(capacity=2), Slow()
    pieces = [Piece((), (i,), NO_CONTEXT, f"k{i}") for i in range(4)]
    assert backfill.submit(cache, pieces[:1]) == 1
    assert backfill.submit(cache, pieces[:1]) == 0  # queued or being computed already
    assert backfill.submit(cache, pieces[1:]) == 1 and backfill.dropped == 2  # 2 at most
    gate.set()
    assert backfill.wait(timeout=10) and backfill.computed == 2
    backfill.close()
    assert backfill.submit(cache, pieces) == 0  # closed: takes nothing


def test_the_worker_ends_when_idle_and_cancel_drops_the_queue():
    import threading
    import time

    from blendrag.engine.caches.backfill import Backfill, Piece

    gate = threading.Event()

    class Slow:
        def kv(self, *args, **kwargs):
            gate.wait(10)

    def computing() -> None:  # until the worker holds a piece
        deadline = time.monotonic() + 10
        while not backfill._busy and time.monotonic() < deadline:
            time.sleep(0.01)

    backfill, cache = Backfill(), Slow()
    pieces = [Piece((), (i,), NO_CONTEXT, f"k{i}") for i in range(3)]
    assert backfill.submit(cache, pieces) == 3 and backfill._thread is not None
    gate.set()
    assert backfill.wait(timeout=10)
    thread = backfill._thread
    if thread is not None:  # past its last piece, not yet out of the loop
        thread.join(10)
    assert backfill._thread is None  # no idle thread kept per engine
    gate.clear()
    assert backfill.submit(cache, pieces) == 3  # a new worker takes them
    computing()
    threading.Timer(0.2, gate.set).start()
    assert backfill.cancel(timeout=10)  # the one being computed finished, the rest dropped
    assert backfill.wait(timeout=10) and backfill.computed == 3 + 1
    assert backfill.dropped == 2
    assert backfill.submit(cache, pieces[:1]) == 1  # still open: a dropped piece queued again
    assert backfill.wait(timeout=10)


def test_prefix_mode_over_a_missing_chunk_runs_a_full_prefill_too(engine_for):
    """Prefix mode's chunk is stored exactly, like the prompt's prefix, but it is a chunk: its
    tokens count toward full_when_missing as they did."""
    from blendrag.engine.selection.controller import LoadingConfig

    engine = engine_for("llama", loading=LoadingConfig(full_when_missing=0.2,
                                                        full_when_faster=False))
    layout = engine.build_prompt(PREFIX, PASSAGES[:3], SUFFIX)
    pre = engine.prefill(layout, BlendConfig(mode="prefix"))
    assert pre.stats.mode == "full" and pre.stats.cache.backfilled == 2  # prefix, chunk 1
    assert pre.stats.controller.mode.reason == "chunks missing"
    # a comparison of modes runs it as asked whatever the loading config says
    asked = engine.prefill(layout, BlendConfig(mode="prefix"), as_asked=True)
    assert asked.stats.mode == "prefix"
