"""The attention kernel of the captured passes, side by side with candidates, at the 7B shape.

A captured cached pass (engine/compute/static_pass.py) runs FlexAttention over the pooled
buffer's whole rows, its queries padded to at least two tiles of 128. On an H200 a warm 3k
reuse request spent 2.3 ms of its 11.5 ms on the device in it: 72 us a layer for 64 queries
over about 3.6k keys, whose K and V a layer are 14 MB, a few microseconds of the card's
bandwidth. Two tiles of 128 rows make 64 programs (2 tiles x 32 heads), each walking every key
block alone. This phase times, per call, the kernel the passes run now and candidates that
split the work otherwise, on the same queries, keys and exact mask, and prints each one's
largest difference from it:

- ``flex 2x128``: what the passes run (``FlexPlan``);
- ``flex unpadded``: the queries padded to a multiple of 16 rows only; below 128 rows
  FlexAttention takes its decoding kernel, which splits the keys across programs;
- ``flex 64x64``: the same mask in tiles of 64 queries and 64 keys (``kernel_options``): twice
  the programs;
- ``sdpa mask``: SDPA with the exact mask as an additive bias (its memory-efficient kernel);
- ``sdpa lower-right``: contiguous queries at the end only (reuse's): SDPA's causal mask
  aligned to the bottom-right corner;
- ``explicit fp32``: the probabilities computed explicitly with the exact mask added in the
  matmul, the q heads of a KV head in one batched GEMM (``layer.attention_probs``: the preview
  pass's attention, whose per-key sums are the preview selector's scores); the GEMMs split the
  keys across the whole card where a tile of queries walks them alone.

Cases: reuse (the 64 question tokens at the end), blend at 15 % and 20 % (chosen chunk tokens
spread over the prompt, then the question), at the 3k prompt and, for reuse and 15 %, the 16k
one. On a CPU (``--small``) only the SDPA and explicit rows run (FlexAttention is the CUDA
kernel)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from blendrag.engine.compute import attention as att
from blendrag.engine.compute import flex
from blendrag.engine.compute.buckets import row_bucket
from blendrag.engine.compute.layer import attention_probs
from blendrag_bench.gpu.shapes import SEVEN_B, TINY, sync
from blendrag_bench.gpu.summary import Headlines
from blendrag_bench.timing import median_time

SUFFIX = 64
CASES = (("3k reuse", 3168, 0.0), ("3k blend@15%", 3168, 0.15), ("3k blend@20%", 3168, 0.20),
         ("16k reuse", 16448, 0.0), ("16k blend@15%", 16448, 0.15))
SMALL_CASES = (("reuse", 448, 0.0), ("blend@15%", 448, 0.15))
CALLS = 20


def run(emit: Callable[[str], None], small: bool, out: Headlines | None = None) -> Headlines:
    """Each case's rows; ``out`` takes each variant's time as it is measured."""
    shape = TINY if small else SEVEN_B
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    h, hkv = shape["heads"], shape["kv_heads"]
    d = shape["hidden"] // h
    emit(f"attention per call (us, median of {CALLS}), {h}/{hkv} heads of {d}, {dtype}; "
         "diff: largest |difference| from the case's first row that ran (flex 2x128; sdpa "
         "mask on a CPU)")
    out = {} if out is None else out
    for label, n, ratio in SMALL_CASES if small else CASES:
        pos = _positions(n, ratio, dev)  # [A]
        keys = att.pad_rows(row_bucket(n, n + 128) or n + 1)  # the pooled buffer's rows
        g = torch.Generator(device=dev).manual_seed(n)
        q = torch.randn(h, pos.shape[0], d, generator=g, device=dev, dtype=dtype)
        k, v = (torch.randn(hkv, keys, d, generator=g, device=dev, dtype=dtype)
                for _ in range(2))
        k[:, n:], v[:, n:] = 0, 0  # rows past the prompt: zeros, as in a request KV
        emit(f"\n{label}: {pos.shape[0]} queries over {n} keys ({keys} rows)")
        rows(emit, label, _variants(pos, n, keys, d ** -0.5, cuda, h // hkv), q, k, v, out)
    return out


def rows(emit: Callable[[str], None], label: str, variants: dict[str, Callable[[], Callable]],
         q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Headlines) -> None:
    """Each variant built, run and timed, its row written and its time put in ``out``; one that
    cannot be built or run here is reported, and the next one runs. Once FlexAttention is off
    for the process (``flex.disable_flex``: it failed to compile or run), the flex rows are
    skipped: they would time the sdpa fallback, or fail again."""
    ref = None
    for name, build in variants.items():
        if name.startswith("flex") and flex.flex_kernel() is None:
            emit(f"  {name:<18} skipped: FlexAttention is not usable here")
            continue
        try:
            call = build()
            o = call(q, k, v)
            us = _time(partial(call, q, k, v))
        except Exception as exc:  # a variant this torch or device cannot run
            emit(f"  {name:<18} failed: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        ref = o if ref is None else ref
        diff = (o.float() - ref.float()).abs().max().item()
        emit(f"  {name:<18} {us:9.1f} us   diff {diff:.2e}")
        out[f"attention {label}, {name} (us)"] = (us, "", None)


def _positions(n: int, ratio: float, dev: torch.device) -> torch.Tensor:
    """The computed positions: ``ratio`` of the chunk tokens (after a 32-token prefix) drawn
    at random, sorted, then the question's ``SUFFIX`` tokens at the end."""
    chunk = n - 32 - SUFFIX
    g = torch.Generator().manual_seed(n)
    chosen = torch.randperm(chunk, generator=g)[:round(ratio * chunk)].sort().values + 32
    return torch.cat([chosen, torch.arange(n - SUFFIX, n)]).to(dev)


def _variants(pos: torch.Tensor, n: int, keys: int, scale: float, cuda: bool,
              groups: int) -> dict[str, Callable[[], Callable]]:
    """Each variant's maker: a variant is made where its failure is caught (``rows``)."""
    a = pos.shape[0]
    bias = att.score_bias(pos, keys if cuda else n, None).to(  # [A, keys]
        torch.bfloat16 if cuda else torch.float32)

    def sdpa_mask(q, k, v):
        rows = bias.shape[1]
        return F.scaled_dot_product_attention(q[None], k[None, :, :rows], v[None, :, :rows],
                                              attn_mask=bias, scale=scale,
                                              enable_gqa=True)[0]

    def lower_right() -> Callable:
        right = att.LowerRightPlan(a, n)
        return lambda q, k, v: right.attend(q, k, v, scale)

    variants: dict[str, Callable[[], Callable]] = {}
    if cuda:
        variants["flex 2x128"] = partial(_flex_plan, pos, n, scale)
        variants["flex unpadded"] = partial(_flex_rows, pos, n, keys, scale, -(-a // 16) * 16,
                                            {})
        variants["flex 64x64"] = partial(_flex_rows, pos, n, keys, scale, att.pad_rows(a),
                                         {"BLOCK_M": 64, "BLOCK_N": 64})
    variants["sdpa mask"] = lambda: sdpa_mask
    if cuda and bool((pos[1:] - pos[:-1] == 1).all()):  # contiguous to the end: reuse's
        variants["sdpa lower-right"] = lower_right
    variants["explicit fp32"] = partial(_explicit, pos, keys if cuda else n, scale, groups)
    return variants


def _flex_plan(pos: torch.Tensor, n: int, scale: float) -> Callable:
    """What the passes run (``FlexPlan``), raising where it gave FlexAttention up for its
    fallback (the sdpa row blocks): that is not FlexAttention's time."""
    plan = att.FlexPlan(pos, n, None, attended_keys=0)

    def call(q, k, v):
        o = plan.attend(q, k, v, scale)
        if plan.fell_back:  # it ran the row blocks instead
            raise RuntimeError("FlexAttention failed; FlexPlan ran its sdpa row blocks instead "
                               "(see the warning above)")
        return o

    return call


def _explicit(pos: torch.Tensor, rows: int, scale: float, groups: int) -> Callable:
    """The preview pass's attention: probabilities in float32 over ``rows`` keys with the exact
    mask (built once, as a pass builds it for all its layers), then one batched GEMM with the
    values."""
    bias = att.score_bias(pos, rows, None, groups)  # [g*A, rows]

    def call(q, k, v):
        heads, a, d = q.shape
        hkv = k.shape[0]
        probs = attention_probs(q, k[:, :rows], None, scale, bias=bias)  # [H, A, rows]
        o = probs.view(hkv, -1, rows).to(v.dtype) @ v[:, :rows]  # [Hkv, g*A, D]
        return o.view(heads, a, d)

    return call


def _flex_rows(pos: torch.Tensor, n: int, keys: int, scale: float, rows: int,
               options: dict) -> Callable:
    """FlexAttention over the same exact mask with the queries padded to ``rows`` and
    ``options`` for its kernel."""
    mask = flex.block_mask_rows(pos, n, keys, None, rows)
    kernel = flex.flex_kernel()
    if kernel is None:
        raise RuntimeError("FlexAttention is not usable here")

    def call(q, k, v):
        a = q.shape[1]
        qp = F.pad(q, (0, 0, 0, rows - a))  # [H, rows, D]
        o = kernel(qp[None], k[None], v[None], block_mask=mask, scale=scale, enable_gqa=True,
                   kernel_options=options or None)
        return o[0, :, :a]

    return call


def _time(call: Callable[[], object]) -> float:
    """Microseconds per call: the median of ``CALLS`` after three warm calls, each between two
    device syncs."""
    return median_time(call, CALLS + 3, skip=3, sync=sync).seconds * 1e6
