"""RoPE at the positions of the current request.

cos/sin come from the model's own ``rotary_emb`` called once per request with every position
of the request, so every RoPE variant (default, linear, llama3, yarn, dynamic NTK) is rotated
exactly as a full prefill of that request would rotate it.
"""

from __future__ import annotations

import torch


class RopeTable:
    """cos/sin for positions [start, n): cos, sin: [n - start, head_dim]."""

    def __init__(self, rotary: torch.nn.Module, n: int, dtype: torch.dtype, device: torch.device,
                 start: int = 0) -> None:
        positions = torch.arange(start, n, device=device)[None]  # [1, n - start]
        probe = torch.empty(0, dtype=dtype, device=device)
        cos, sin = rotary(probe, positions)
        self.start = start
        self.cos: torch.Tensor = cos[0]
        self.sin: torch.Tensor = sin[0]

    def rotate(self, x: torch.Tensor, pos: torch.Tensor | slice) -> torch.Tensor:
        """x: [heads, A, D] at absolute positions ``pos`` -> rotated x (same shape, contiguous)."""
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.rotate_into(out, x, pos)
        return out

    def rotate_into(self, out: torch.Tensor, x: torch.Tensor, pos: torch.Tensor | slice) -> None:
        """Write x: [heads, A, D] rotated at positions ``pos`` into ``out`` (same shape, any
        strides: e.g. rows of the request's KV), with the arithmetic of HF's
        ``x * cos + rotate_half(x) * sin`` (bit for bit) but without its four temporaries of
        x's size: cached keys are rotated at every layer of every request."""
        idx: torch.Tensor | slice
        if isinstance(pos, slice):
            idx = slice(pos.start - self.start, pos.stop - self.start)
        else:
            idx = pos - self.start if self.start else pos
        cos, sin = self.cos[idx], self.sin[idx]  # [A, D]
        h = x.shape[-1] // 2
        x1, x2, o1, o2 = x[..., :h], x[..., h:], out[..., :h], out[..., h:]
        # rotate_half(x) = [-x2, x1]: o1 = x1*c1 + (-x2)*s1 == x1*c1 - x2*s1 exactly
        torch.mul(x1, cos[:, :h], out=o1)
        o1.sub_(x2 * sin[:, :h])
        torch.mul(x2, cos[:, h:], out=o2)
        o2.add_(x1 * sin[:, h:])
