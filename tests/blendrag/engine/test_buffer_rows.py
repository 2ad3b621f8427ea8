"""A pooled request buffer lent to another request (another tenant's, perhaps) hands back no row
of the earlier request: what a prefill returns (its KV views and the whole buffer they are views
of) holds zeros past its own length."""

from __future__ import annotations

import torch

from blendrag import BlendConfig
from blendrag.engine.compute.fused_kv import BufferPool
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

CPU = torch.device("cpu")
SHAPE = (2, 2, 4)  # layers, kv heads, head dim


def _rows_past(t: torch.Tensor, n: int) -> int:
    """How many rows past ``n`` of ``t`` [layers, heads, rows, dim] are not all zeros."""
    return int(t[:, :, n:].ne(0).any(dim=(0, 1, 3)).sum())


def _take(pool: BufferPool, capacity: int):
    layers, heads, dim = SHAPE
    return pool.take(layers, heads, capacity, dim, torch.float32, CPU)


def test_a_long_request_then_a_short_one_in_two_namespaces(engine_for):
    engine = engine_for("llama")
    a, b = engine.namespaced("tenant-a"), engine.namespaced("tenant-b")
    long = a.build_prompt(PREFIX, PASSAGES * 2, SUFFIX)
    short = b.build_prompt(PREFIX, PASSAGES[:1], "Where?")
    first = a.prefill(long, BlendConfig(mode="reuse"))
    ptr = first.fused.k.data_ptr()
    del first  # its buffer is lent to the next request
    second = b.prefill(short, BlendConfig(mode="reuse"))
    n = short.num_tokens
    assert second.fused.k.data_ptr() == ptr  # the pooled buffer was lent again
    assert second.fused.length == n < long.num_tokens
    for t in (*second.fused.base, second.fused.k, second.fused.v):
        assert _rows_past(t, n) == 0
    assert second.fused.k[:, :, :n].ne(0).any(dim=(0, 1, 3)).all()  # its own rows are there


def test_the_rows_an_earlier_request_left_are_zeroed_and_no_more():
    pool = BufferPool()
    with torch.inference_mode():
        first = _take(pool, 200)
        first.k.fill_(1.0)
        first.v.fill_(2.0)
        first.length = 180
        first.drop_earlier_rows()
        del first
        second = _take(pool, 50)
        second.k[:, :, :30] = 3.0  # its prompt: 30 rows
        second.length = 30
        second.drop_earlier_rows()  # its main pass done
        assert _rows_past(second.base[0], 30) == 0 and _rows_past(second.base[1], 30) == 0
        assert second.k[:, :, :30].eq(3.0).all()  # its own rows are kept
        second.k[:, :, 30:40] = 4.0  # decoding writes rows after the prompt: kept
        second.length = 40
        assert second.k[:, :, 30:40].eq(4.0).all()


def test_an_attempt_that_stops_before_its_length_is_set_leaves_nothing_to_the_next():
    pool = BufferPool()
    with torch.inference_mode():
        whole = _take(pool, 8)
        whole.length = 0
        whole.drop_earlier_rows()
        del whole
        failed = _take(pool, 120)  # views of the pooled buffer (256 rows)
        failed.k[:, :, :120] = 5.0  # written, then abandoned with no length set
        del failed
        short = _take(pool, 10)
        short.length = 10
        short.drop_earlier_rows()
        assert _rows_past(short.base[0], 10) == 0 and _rows_past(short.base[1], 10) == 0
        assert short.k[:, :, :10].eq(5.0).all()  # rows before its length are left to it


def test_rows_placed_ahead_of_an_early_pass_are_not_dropped():
    """A pass before the main one (the bridge after prefix-cache rows) sets the length while the
    layer feed may have placed later rows already: those rows stay (they were zeroed when the
    length was first set, giving wrong logits now and then)."""
    pool = BufferPool()
    with torch.inference_mode():
        first = _take(pool, 100)
        first.k.fill_(1.0)
        first.length = 100
        first.drop_earlier_rows()
        del first
        second = _take(pool, 80)
        second.k[:, :, 46:80] = 7.0  # placed ahead by the feed: a later chunk's rows
        second.length = 46  # the bridge's pass ends at row 46
        assert second.k[:, :, 46:80].eq(7.0).all()
        second.length = 80  # the main pass
        second.drop_earlier_rows()
        assert second.k[:, :, 46:80].eq(7.0).all() and _rows_past(second.base[0], 80) == 0


def test_no_pass_reads_the_rows_an_earlier_request_left(engine_for):
    """Rows past the prompt that an earlier request left (here inf, as an fp16 overflow leaves)
    are zeroed before the first pass: the fixed-shape pass attends over its whole row bucket,
    where a masked inf key or value is still NaN."""
    from blendrag import ComputeConfig, PromptLayout

    g = torch.Generator().manual_seed(17)
    layout = PromptLayout(*(torch.randint(4, 400, (n,), generator=g).tolist() for n in (6,)),
                          [torch.randint(4, 400, (n,), generator=g).tolist() for n in (30, 25)],
                          torch.randint(4, 400, (6,), generator=g).tolist())
    n, reuse = layout.num_tokens, BlendConfig(mode="reuse")
    for passes in ("graph", "eager"):
        engine = engine_for("llama", compute=ComputeConfig(passes=passes))
        clean = engine.prefill(layout, reuse, 40).logits
        dirty = engine.prefill(layout, reuse, 40)
        k, v = dirty.fused.base
        k[:, :, n:], v[:, :, n:] = float("inf"), float("inf")
        del dirty, k, v
        again = engine.prefill(layout, reuse, 40)
        assert torch.equal(again.logits, clean), passes
        # past the prompt: zeros, but for the fixed-shape pass's padding row (its own, finite)
        assert _rows_past(again.fused.k, n) <= 1 and _rows_past(again.fused.v, n) <= 1
        assert torch.isfinite(again.fused.k).all() and torch.isfinite(again.fused.v).all()
