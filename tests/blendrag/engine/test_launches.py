"""What a request costs its loop's thread, counted on the CPU: on a GPU a request of a few
thousand tokens is bound by kernel launches and host syncs, and both can be counted anywhere.

The ops each layer adds are the request's aten ops (seen by a ``TorchDispatchMode`` on the
loop's thread) on a 4-layer model less those on the same model with 2 layers, halved; the
host conversions (``item``, ``tolist``, ``cpu``, a tensor's ``bool``/``int``, ``nonzero``)
are seen by a ``TorchFunctionMode``. A tiny Llama, three chunks of 64 tokens.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blendrag import BlendConfig
from blendrag.engine.caches.prefix_cache import PrefixCache
from blendrag.prompt import PromptLayout
from helpers.host_reads import HostReads

MODES = {
    "full": BlendConfig(mode="full"),
    "prefix": BlendConfig(mode="prefix"),
    "reuse": BlendConfig(mode="reuse"),
    "cacheblend": BlendConfig(selector="cacheblend", ratio=0.15),
    "epic": BlendConfig(selector="epic", ratio=0.15),
    "default": BlendConfig(),
}
# what builds a mask: comparisons of positions, their combinations and the fills
MASK_OPS = {"arange", "le", "lt", "ge", "gt", "bitwise_and", "bitwise_or", "logical_not",
            "masked_fill", "masked_fill_", "where", "zeros", "repeat"}
COPIES = {"copy_", "cat", "index_copy_", "index_put_", "clone", "_to_copy", "index_select"}


class Ops(TorchDispatchMode):
    """aten ops by name; SDPA's attention masks that are boolean (converted at every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.bool_masks = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name == "scaled_dot_product_attention":
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.bool_masks += isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
        return func(*args, **kwargs)


def layout_of(engine) -> PromptLayout:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(20, 400, (3 * 64 + 16,), generator=g).tolist()
    return PromptLayout(ids[:6], [ids[6 + 64 * i:70 + 64 * i] for i in range(3)], ids[-10:])


def measured(engine, config: BlendConfig) -> tuple[Ops, HostReads]:
    layout = layout_of(engine)
    engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids, profile=True)
    engine.prefill(layout, config)  # warm: buffers, the store's RAM tier
    ops, host = Ops(), HostReads()
    with ops, host:
        engine.prefill(layout, config)
    return ops, host


@pytest.fixture(scope="module")
def counts(engine_for):
    """{(layers, mode): (ops, host reads)} for 2 and 4 layers."""
    return {(layers, name): measured(engine_for("llama", layers=layers), config)
            for layers in (2, 4) for name, config in MODES.items()}


def per_layer(counts, name: str, ops: set[str] | None = None) -> float:
    def total(c: Ops) -> int:
        return sum(v for k, v in c.ops.items() if ops is None or k in ops)

    return (total(counts[4, name][0]) - total(counts[2, name][0])) / 2


def test_cached_modes_add_few_ops_per_layer_over_a_full_prefill(counts):
    full = per_layer(counts, "full")
    assert per_layer(counts, "reuse") <= 1.25 * full
    assert per_layer(counts, "prefix") <= 1.25 * full
    assert per_layer(counts, "epic") <= 1.25 * full  # a static selector: one pass
    assert per_layer(counts, "cacheblend") <= 1.25 * full
    # the default runs two passes, the preview pass and the blend pass, each of a full layer's
    # ops but the preview's attention (explicit: its probabilities are the selector's scores;
    # a few ops more than one fused call)
    assert per_layer(counts, "default") <= 2 * full + 4


@pytest.mark.parametrize("name", list(MODES))
def test_no_layer_builds_an_attention_mask(counts, name):
    assert per_layer(counts, name, MASK_OPS) == 0
    assert counts[4, name][0].bool_masks == 0  # SDPA would convert it at every call


@pytest.mark.parametrize("name", list(MODES))
def test_host_reads_do_not_grow_with_the_layers(counts, name):
    two, four = counts[2, name][1].count, counts[4, name][1].count
    assert two == four
    assert sum(four.values()) <= 8, four


def test_cached_rows_are_placed_off_the_loops_thread(counts):
    """Pipelined (the default), the reader copies and rotates the cached rows: the loop's
    thread runs no copy for them, whatever the number of layers."""
    assert per_layer(counts, "reuse", COPIES) == per_layer(counts, "full", COPIES)


def test_a_prefix_cache_turn_copies_its_rows_whatever_the_blocks(engine_for):
    """The cached blocks are written into the request's KV with a constant number of copies
    (one join and one copy, keys and values), not one per block."""
    engine = engine_for("llama")
    copies = []
    for blocks in (2, 8):
        cache = PrefixCache(1 << 26, lambda: "root", block_tokens=8)
        g = torch.Generator().manual_seed(blocks)
        ids = torch.randint(20, 400, (8 * blocks + 12,), generator=g).tolist()
        first = engine.prefill(PromptLayout(ids[:4], [ids[4:-4]], ids[-4:]),
                               BlendConfig(mode="full"))
        cache.insert(ids, first.fused, exact_rows=len(ids))
        found = cache.match(ids, exact_only=True)
        assert found.tokens == 8 * (len(ids) // 8)
        ops = Ops()
        with ops:
            PrefixCache.copy_into(found, engine.runner.buffer(len(ids)), found.tokens)
        copies.append(sum(v for k, v in ops.ops.items() if k in COPIES))
    assert copies[0] == copies[1] <= 4
