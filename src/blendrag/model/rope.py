"""RoPE at the positions of the current request.

cos/sin come from the model's own ``rotary_emb`` called once per request with every position
of the request, so every RoPE variant (default, linear, llama3, yarn, dynamic NTK, partial
rotary) is rotated exactly as a full prefill of that request would rotate it. A family whose
layers rotate with different frequencies (Gemma 3: local and global layers) has one table per
kind of layer (``RopeTables``, built by the adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class RopeTable:
    """cos/sin for positions [start, n): cos, sin: [n - start, R], R <= head_dim the rotated
    dimensions (R < head_dim: partial rotary, the rest passes unrotated).

    ``rotary(probe, positions)``: the model's rotary embedding (or one layer kind's)."""

    def __init__(self, rotary: Callable[[torch.Tensor, torch.Tensor],
                                        tuple[torch.Tensor, torch.Tensor]],
                 n: int, dtype: torch.dtype, device: torch.device, start: int = 0) -> None:
        positions = torch.arange(start, n, device=device)[None]  # [1, n - start]
        probe = torch.empty(0, dtype=dtype, device=device)
        cos, sin = rotary(probe, positions)
        self.start = start
        self.cos: torch.Tensor = cos[0]
        self.sin: torch.Tensor = sin[0]
        self._swapped: torch.Tensor | None = None  # sin with its halves swapped, made once

    def at(self, pos: torch.Tensor | slice) -> Rotation:
        """The rotation at absolute positions ``pos`` ([A] or a slice): cos/sin gathered once,
        for every tensor rotated at those positions (each layer's queries and keys)."""
        if isinstance(pos, slice):  # e.g. rows placed in the request's KV, rotated in place
            rows = slice(pos.start - self.start, pos.stop - self.start)
            return Rotation(self.cos[rows], self.sin[rows], self.swapped_sin()[rows])
        idx = pos - self.start if self.start else pos
        return Rotation(self.cos[idx], self.sin[idx])

    def swapped_sin(self) -> torch.Tensor:
        """[n - start, R]: sin's halves swapped, [s2, s1] (``Rotation.rotate_in_place``), made
        at the first use: one kernel per table and request, for every layer's cached rows."""
        if self._swapped is None:
            self._swapped = _swap_halves(self.sin)
        return self._swapped

    def rotate(self, x: torch.Tensor, pos: torch.Tensor | slice) -> torch.Tensor:
        """x: [heads, A, D] at absolute positions ``pos`` -> rotated x (same shape, contiguous)."""
        return self.at(pos).rotate(x)

    def rotate_into(self, out: torch.Tensor, x: torch.Tensor, pos: torch.Tensor | slice) -> None:
        """Write x: [heads, A, D] rotated at positions ``pos`` into ``out`` (see
        ``Rotation.rotate_into``)."""
        self.at(pos).rotate_into(out, x)


class Rotation:
    """RoPE at one set of positions: cos, sin: [A, R] split into their halves once.

    The positions a request computes change only at a selector's check layers, and layers of
    one kind share their table, so one ``Rotation`` serves the queries and keys of many layers:
    the gather of cos/sin is not repeated per layer. ``swapped``: sin's halves swapped, [A, R]
    (``RopeTable.swapped_sin``; made here when not given)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor,
                 swapped: torch.Tensor | None = None) -> None:
        self.rotary_dim = r = cos.shape[-1]
        h = r // 2
        self.dtype = cos.dtype  # computed in: the model's dtype, or float32 (OLMo 2)
        self.cos, self.sin, self._swapped = cos, sin, swapped
        self.c1, self.c2 = cos[:, :h], cos[:, h:]  # [A, R/2] each
        self.s1, self.s2 = sin[:, :h], sin[:, h:]

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x: [heads, A, D] -> rotated x (same shape, contiguous)."""
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.rotate_into(out, x)
        return out

    def rotate_into(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """Write x: [heads, A, D] rotated into ``out`` (same shape, any strides: e.g. rows of the
        request's KV), with the arithmetic of HF's ``x * cos + rotate_half(x) * sin`` (bit for
        bit) but without its four temporaries of x's size: cached keys are rotated at every
        layer of every request."""
        r = self.rotary_dim
        if r < x.shape[-1]:  # partial rotary: HF rotates x[..., :R] and passes the rest
            out[..., r:] = x[..., r:]
            x, out = x[..., :r], out[..., :r]
        h = r // 2
        x1, x2, o1, o2 = x[..., :h], x[..., h:], out[..., :h], out[..., h:]
        c1, c2, s1, s2 = self.c1, self.c2, self.s1, self.s2
        if self.dtype != x.dtype:
            # a rotary embedding that keeps cos/sin in float32 (OLMo 2) rotates in float32 and
            # rounds once, as HF's promotion does
            x1, x2 = x1.to(self.dtype), x2.to(self.dtype)
            o1.copy_(x1 * c1 - x2 * s1)
            o2.copy_(x2 * c2 + x1 * s2)
            return
        # rotate_half(x) = [-x2, x1]: o1 = x1*c1 + (-x2)*s1 == x1*c1 - x2*s1 exactly
        torch.mul(x1, c1, out=o1)
        o1.sub_(x2 * s1)
        torch.mul(x2, c2, out=o2)
        o2.add_(x1 * s2)

    def unrotate(self, x: torch.Tensor) -> torch.Tensor:
        """x: [heads, A, D] rotated at these positions -> x before RoPE (the inverse rotation,
        computed in float32 and rounded once to x's dtype): rows kept from a request, moved
        to other positions later (engine/caches/history.py)."""
        r = self.rotary_dim
        h = r // 2
        f = x.float()
        out = f.clone()
        o1, o2 = f[..., :h], f[..., h:r]
        c1, c2, s1, s2 = (t.float() for t in (self.c1, self.c2, self.s1, self.s2))
        # o1 = x1*c - x2*s, o2 = x2*c + x1*s (c1 == c2, s1 == s2: HF repeats the frequencies);
        # c^2 + s^2 is 1 only for plain RoPE: yarn and longrope scale cos and sin by an
        # attention factor, which the inverse divides out twice
        norm = c1 * c1 + s1 * s1  # [A, R/2]
        out[..., :h] = (o1 * c1 + o2 * s2) / norm
        out[..., h:r] = (o2 * c2 - o1 * s1) / norm
        return out.to(x.dtype)

    def rotate_in_place(self, x: torch.Tensor) -> None:
        """Rotate x: [..., A, D] where it lies (rows of the request's KV that hold pre-RoPE
        keys: [heads, A, D] of one layer, or [layers, heads, A, D] of many), with
        ``rotate_into``'s arithmetic (bit for bit): many segments' rows of many layers, copied
        in side by side, rotated by one set of four kernels (six when cos/sin are float32).

        Its temporaries (the products with sin, and x in float32 for float32 cos/sin) are at
        most ``SCRATCH_BYTES`` of x's device at a time: layers beyond that are rotated a block
        at a time."""
        x = x[..., :self.rotary_dim]  # partial rotary: the rest passes unrotated
        if x.dim() > 3:  # [layers, heads, A, R]: the scratch of a block of layers is bounded
            per_layer = x[0].numel() * self.dtype.itemsize * (1 if self.dtype == x.dtype else 2)
            bound = SCRATCH_BYTES.get(x.device.type, SCRATCH_BYTES["cuda"])
            step = max(1, bound // max(per_layer, 1))
            if step < x.shape[0]:
                for a in range(0, x.shape[0], step):
                    self.rotate_in_place(x[a:a + step])
                return
        if self.dtype == x.dtype:
            self._rotate(x)
            return
        f = x.to(self.dtype)  # float32 cos/sin: rotated in float32, rounded once
        self._rotate(f)
        x.copy_(f)

    def _rotate(self, x: torch.Tensor) -> None:
        """x: [..., A, R] in cos/sin's dtype, rotated in place: x1*c1 - x2*s1 and x2*c2 + x1*s2,
        each product rounded once and then the sum, as ``rotate_into`` (and HF) compute them."""
        h = self.rotary_dim // 2
        if self._swapped is None:
            self._swapped = _swap_halves(self.sin)
        p = x * self._swapped  # [..., A, R]: [x1*s2, x2*s1], before x changes
        x.mul_(self.cos)  # [x1*c1, x2*c2]
        x[..., :h].sub_(p[..., h:])
        x[..., h:].add_(p[..., :h])


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    """t: [A, R] -> [A, R] with its halves swapped: [t2, t1]."""
    h = t.shape[-1] // 2
    return torch.cat((t[:, h:], t[:, :h]), dim=-1)


# At most this many bytes of temporaries while rotating cached keys in place, by device type (a
# block of layers at a time): every layer of a long prompt's rows at once would need as much
# again as the request's keys. A GPU is bound by launches, so its blocks are large; a CPU
# by memory traffic, so its blocks fit in its caches with the rows they rotate (the four
# passes then read them there): bench ttft's 32 layers x 3,104 rows were placed in 12-14 ms
# with blocks of 1-2 MiB, 17 ms with 4 MiB, 26 ms with 16 MiB and 40 ms all at once (one
# thread; 15-19 ms layer by layer before).
SCRATCH_BYTES = {"cpu": 2 << 20, "cuda": 64 << 20}


class RopeTables:
    """The RoPE table of every layer of a request (layers of one kind share one table)."""

    def __init__(self, per_layer: Sequence[RopeTable]) -> None:
        self._per_layer = list(per_layer)

    def layer(self, i: int) -> RopeTable:
        """The table layer ``i`` rotates its queries and keys with."""
        return self._per_layer[i]
