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
        """x: [heads, A, D] at absolute positions ``pos`` -> rotated x (same shape)."""
        if isinstance(pos, slice):
            idx = slice(pos.start - self.start, pos.stop - self.start)
        else:
            idx = pos - self.start if self.start else pos
        return apply_rope(x, self.cos[idx], self.sin[idx])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, A, D]; cos, sin: [A, D]."""
    return x * cos + rotate_half(x) * sin
