"""Next-token choice from first/next-token logits: greedy, or temperature + top-k + top-p."""

from __future__ import annotations

import torch

from blendrag.config import GenerationConfig


def make_generator(cfg: GenerationConfig, device: torch.device) -> torch.Generator | None:
    if cfg.greedy:
        return None
    g = torch.Generator(device=device)
    if cfg.seed is None:
        g.seed()
    else:
        g.manual_seed(cfg.seed)
    return g


def next_token(logits: torch.Tensor, cfg: GenerationConfig,
               generator: torch.Generator | None) -> int:
    """logits: [vocab] -> token id."""
    if cfg.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / cfg.temperature
    if cfg.top_k:
        kth = torch.topk(scores, min(cfg.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum - sorted_scores.softmax(-1) >= cfg.top_p  # keep the smallest set reaching top_p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
