"""Attention of a layer's computed tokens over the request's KV, planned once per set of tokens.

Which tokens a layer computes changes only at a selector's check layers, and everything the
attention needs besides q, k and v (the kernel, the blocks of query rows, their masks, the keys
attended) depends only on their positions and the layer's sliding window. So it is planned
once (``plan_attention``) and every layer that computes those tokens reuses the plan: no layer
builds a mask or reads a position back from the device.

The mask is always exact: a query at position p sees the keys at positions <= p (and > p -
window). The kernel follows the shape of the queries:

- every position [0, n): one causal call (``is_causal``);
- one query at the last position (a one-token suffix): no mask at all;
- contiguous queries [s, n) (prefix mode, a prefix-cache tail, reuse's suffix) on CUDA: SDPA
  with a lower-right causal bias, which the flash kernel runs as its own causal mask;
- scattered queries (blend's selected tokens), and windows, with the ``flex`` kernel:
  FlexAttention with a block mask built on the device from the sorted positions (key blocks
  wholly visible to a tile of 128 queries are "full", those after its last query skipped,
  the mask evaluated only in between), compiled once per process;
- otherwise (the CPU, soft-capped attention): the queries cut into position-sorted blocks of
  64 rows that see only the keys up to their own last position, each with its additive mask
  built once. CPU kernels cannot skip masked blocks, so this removes most of the masked work;
  a dense mask handed to SDPA on CUDA takes a masked kernel about ten times slower per FLOP
  than the causal one, which is why CUDA takes the two paths above.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from blendrag.engine.compute.flex import FLEX_BLOCK, block_mask_rows, disable_flex, flex_kernel
from blendrag.engine.compute.softcap import capped_attention

log = logging.getLogger(__name__)

ATTENTION_KERNELS = ("auto", "sdpa", "flex")
"""``sdpa``: PyTorch's SDPA kernels (row blocks with masks for scattered queries); ``flex``:
FlexAttention for scattered queries and windows (compiled: a C++ compiler on the CPU, Triton on
CUDA); ``auto``: ``flex`` on CUDA, ``sdpa`` elsewhere (the compile costs more than it saves on
a CPU, where the row blocks are as fast)."""

ROW_BLOCK = 64  # query rows per masked block: the fastest measured on the CPU


def kernel_for(attention: str, device: torch.device) -> str:
    """The kernel an engine set to ``attention`` runs on ``device``: ``sdpa`` or ``flex``."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {ATTENTION_KERNELS}, got {attention!r}")
    if attention == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return attention


class AttentionPlan:
    """How the queries at one set of positions attend over keys [0, n); ``attended_keys``: the
    keys they see, summed over queries (the attention work, for the stats)."""

    n: int
    attended_keys: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q: [H, A, D] over the layer's KV k, v: [Hkv, >= n, D] -> o: [H, A, D]."""
        raise NotImplementedError


class CausalPlan(AttentionPlan):
    """Every position [0, n): the plain causal kernel."""

    def __init__(self, n: int) -> None:
        self.n, self.attended_keys = n, n * (n + 1) // 2

    def attend(self, q, k, v, scale):
        n = self.n
        return F.scaled_dot_product_attention(q[None], k[None, :, :n], v[None, :, :n],
                                              is_causal=True, scale=scale, enable_gqa=True)[0]


class LastPlan(AttentionPlan):
    """One query at n - 1, which sees every key: no mask."""

    def __init__(self, n: int) -> None:
        self.n, self.attended_keys = n, n

    def attend(self, q, k, v, scale):
        n = self.n
        return F.scaled_dot_product_attention(q[None], k[None, :, :n], v[None, :, :n],
                                              scale=scale, enable_gqa=True)[0]


class LowerRightPlan(AttentionPlan):
    """Contiguous queries [n - A, n): a causal mask aligned to the bottom-right corner, which
    CUDA's flash kernel runs without a mask tensor (elsewhere torch builds the mask per call)."""

    def __init__(self, a: int, n: int) -> None:
        from torch.nn.attention.bias import causal_lower_right

        self.n, self.attended_keys = n, a * (2 * n - a + 1) // 2
        self.bias = causal_lower_right(a, n)

    def attend(self, q, k, v, scale):
        n = self.n
        return F.scaled_dot_product_attention(q[None], k[None, :, :n], v[None, :, :n],
                                              attn_mask=self.bias, scale=scale,
                                              enable_gqa=True)[0]


class PaddedCausalPlan(AttentionPlan):
    """Contiguous queries [n - A, n) that are most of the prompt (prefix mode's tail): run as a
    full prefill's causal call over all n rows, the first n - A queries zeros and their output
    dropped. On CUDA the causal call is the fastest kernel there is (cuDNN's flash on an H200;
    the bottom-right mask runs on the older flash kernel, ~1.7x slower per FLOP), so when A >=
    n / 2 the padded rows cost less than the slower kernel; and each kept row is computed
    exactly as a full prefill computes it."""

    def __init__(self, a: int, n: int) -> None:
        self.a, self.n, self.attended_keys = a, n, a * (2 * n - a + 1) // 2
        self._q: torch.Tensor | None = None  # [H, n, D], zeros before the queries; reused

    def attend(self, q, k, v, scale):
        # q: [H, A, D] -> padded [H, n, D]; k, v: [Hkv, >= n, D]
        n, a = self.n, self.a
        if self._q is None or self._q.shape[0::2] != q.shape[0::2] or self._q.dtype != q.dtype:
            self._q = q.new_zeros(q.shape[0], n, q.shape[2])
        self._q[:, n - a:].copy_(q)
        o = F.scaled_dot_product_attention(self._q[None], k[None, :, :n], v[None, :, :n],
                                           is_causal=True, scale=scale, enable_gqa=True)[0]
        return o[:, n - a:]


class BlockPlan(AttentionPlan):
    """Query rows in position-sorted blocks of ``ROW_BLOCK``, each over the keys up to its last
    position with its mask built here, once: additive (0 / -inf, in ``dtype``) for SDPA, or
    boolean for soft-capped attention (``softcap``)."""

    def __init__(self, pos: torch.Tensor, bounds: list[int], n: int, window: int | None,
                 dtype: torch.dtype, softcap: float | None = None) -> None:
        self.n, self.softcap = n, softcap
        self.attended_keys = _attended(bounds, window)
        self.blocks: list[tuple[slice, slice, torch.Tensor]] = []
        a = len(bounds)
        for start in range(0, a, ROW_BLOCK):
            stop = min(a, start + ROW_BLOCK)
            lo = 0 if window is None else max(0, bounds[start] - window + 1)
            hi = bounds[stop - 1] + 1
            keys = torch.arange(lo, hi, device=pos.device)
            p = pos[start:stop, None]
            visible = keys[None] <= p  # [rows, keys]
            if window is not None:
                visible &= keys[None] > p - window
            mask = visible if softcap is not None else torch.zeros(
                visible.shape, dtype=dtype, device=pos.device).masked_fill_(~visible,
                                                                            float("-inf"))
            self.blocks.append((slice(start, stop), slice(lo, hi), mask))

    def attend(self, q, k, v, scale):
        if self.softcap is not None:
            outs = [capped_attention(q[:, rows], k[:, keys], v[:, keys], mask, scale,
                                     self.softcap) for rows, keys, mask in self.blocks]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [H, A, D]
        if len(self.blocks) == 1:  # every row: q whole
            _, keys, mask = self.blocks[0]
            return F.scaled_dot_product_attention(q[None], k[None, :, keys], v[None, :, keys],
                                                  attn_mask=mask, scale=scale,
                                                  enable_gqa=True)[0]
        q4, k4, v4 = q[None], k[None], v[None]
        outs = [F.scaled_dot_product_attention(
            q4[:, :, rows], k4[:, :, keys], v4[:, :, keys], attn_mask=mask, scale=scale,
            enable_gqa=True) for rows, keys, mask in self.blocks]
        return torch.cat(outs, dim=2)[0]  # [H, A, D]


class FlexPlan(AttentionPlan):
    """FlexAttention with a block mask built on the device from the sorted positions ``pos``:
    per tile of ``FLEX_BLOCK`` queries, the key blocks every query of the tile sees whole are
    full (no mask evaluated), those no query of it sees are skipped, and the mask ``kv <= p``
    (and ``kv > p - window``) is evaluated on the rest. No host sync.

    Shapes repeat so that one compiled kernel serves every request: the keys are the layer's
    whole buffer (``k``, ``v``: [Hkv, capacity, D], a multiple of ``FLEX_BLOCK`` rows; blocks
    past the prompt are skipped, and the rows past it in its last block are masked and hold no
    NaN, engine/compute/fused_kv.py), the queries at least two tiles (padded with the last position,
    their rows dropped): sizes of one tile or one block would each compile a kernel of their
    own."""

    def __init__(self, pos: torch.Tensor, n: int, window: int | None,
                 attended_keys: int) -> None:
        self.n, self.attended_keys, self.window = n, attended_keys, window
        self._pos = pos
        self._mask: tuple[int, object] | None = None  # (keys, BlockMask)
        self._fallback: BlockPlan | None = None
        self._short = False  # out of device memory once: this plan's layers take the row blocks

    @property
    def fell_back(self) -> bool:
        """Whether a layer ran the sdpa row blocks instead of FlexAttention (a benchmark must
        not time them under FlexAttention's name)."""
        return self._fallback is not None

    def block_mask(self, keys: int):
        """The ``BlockMask`` over ``keys`` key rows (built once)."""
        if self._mask is None or self._mask[0] != keys:
            self._mask = keys, block_mask_rows(self._pos, self.n, keys, self.window,
                                               pad_rows(self._pos.shape[0]))
        return self._mask[1]

    def attend(self, q, k, v, scale):
        flex = None if self._short else flex_kernel()
        if flex is not None:
            try:
                a, keys = q.shape[1], k.shape[1]
                rows = pad_rows(a)
                qp = F.pad(q, (0, 0, 0, rows - a))  # [H, rows, D]
                o = flex(qp[None], k[None], v[None], block_mask=self.block_mask(keys),
                         scale=scale, enable_gqa=True)
                return o[0, :, :a]
            except Exception as exc:  # no compiler, an unsupported shape: exact, but slower
                if q.is_cuda and torch.cuda.is_current_stream_capturing():
                    raise  # the fallback reads positions back: the capture gives up instead
                if isinstance(exc, torch.OutOfMemoryError):  # this pass only
                    self._short = True
                    log.warning("FlexAttention ran out of device memory (%s); this pass takes "
                                "the row blocks of the sdpa kernel (exact, slower)", exc)
                else:
                    disable_flex(exc)
        if self._fallback is None:
            bounds = self._pos.tolist()
            self._fallback = BlockPlan(self._pos, bounds, self.n, self.window, q.dtype)
        return self._fallback.attend(q, k, v, scale)


def pad_rows(n: int) -> int:
    """The rows of a request KV buffer made for ``n`` rows, or of ``FlexPlan``'s queries for
    ``n`` queries: whole FlexAttention blocks, at least two (``FlexPlan`` reads the whole
    buffer; fewer blocks would compile another kernel)."""
    return max(2, -(-n // FLEX_BLOCK)) * FLEX_BLOCK


def plan_attention(pos: torch.Tensor, n: int, window: int | None, kernel: str = "sdpa",
                   dtype: torch.dtype = torch.float32,
                   softcap: float | None = None) -> AttentionPlan:
    """The plan of queries at ``pos`` ([A], sorted, unique, the last one < n) over keys [0, n)
    with the layer's ``window`` (None: causal); ``kernel``: ``sdpa`` or ``flex``
    (``kernel_for``); ``dtype``: the queries' (additive masks are built in it); ``softcap``:
    the family's attention soft cap (explicit attention, boolean masks). Reads the positions
    back from the device once (on the CPU, free)."""
    a = pos.shape[0]
    if a == 0:
        raise ValueError("attention needs at least one query")
    windowed = window is not None and window < n
    if softcap is not None:
        return BlockPlan(pos, pos.tolist(), n, window, dtype, softcap)
    if kernel == "sdpa" and (pos.device.type != "cuda" or windowed):
        bounds = pos.tolist()
        first, last = bounds[0], bounds[-1]
        if not windowed and a == n:
            return CausalPlan(n)
        if not windowed and a == 1 and first == n - 1:
            return LastPlan(n)
        return BlockPlan(pos, bounds, n, window, dtype)
    w = window if windowed else n + 1
    first, last, attended = torch.stack(
        [pos[0], pos[-1], (pos + 1).clamp(max=w).sum()]).tolist()
    if not windowed and last - first + 1 == a and last == n - 1:  # contiguous, to the end
        if a == n:
            return CausalPlan(n)
        if a == 1:
            return LastPlan(n)
        if pos.device.type == "cuda":
            return PaddedCausalPlan(a, n) if 2 * a >= n else LowerRightPlan(a, n)
    if kernel == "flex":
        return FlexPlan(pos, n, window if windowed else None, attended)
    return BlockPlan(pos, pos.tolist(), n, window, dtype)


def score_bias(pos: torch.Tensor, n: int, window: int | None, groups: int = 1) -> torch.Tensor:
    """The exact mask of queries at ``pos`` [S] over keys [0, n) as an additive float32 bias
    (0: visible, -inf: hidden), [groups * S, n]: its rows repeated for each of the ``groups``
    query heads that read one KV head (``attention_probs`` folds them into one matmul). Built
    once for every layer of a pass."""
    keys = torch.arange(n, device=pos.device)
    hidden = keys[None] > pos[:, None]  # [S, n]
    if window is not None:
        hidden |= keys[None] <= pos[:, None] - window
    bias = torch.zeros(hidden.shape, dtype=torch.float32, device=pos.device)
    bias.masked_fill_(hidden, float("-inf"))
    return bias.repeat(groups, 1) if groups > 1 else bias


def _attended(bounds: list[int], window: int | None) -> int:
    return sum(min(p + 1, window) for p in bounds) if window else sum(bounds) + len(bounds)
