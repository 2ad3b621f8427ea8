"""Decoding after a prefill: one token loop shared by streaming and non-streaming generation,
and the choice of each next token (greedy, or temperature + top-k + top-p).

``GenerationStream`` yields text deltas; ``generate`` simply drains it, so both paths produce
the same text by construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from blendrag.config import GenerationConfig
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.threads import torch_threads
from blendrag.engine.request.prefill import Prefill
from blendrag.engine.request.stats import RequestStats


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" | "stop" | "length"
    stats: RequestStats


class GenerationStream:
    """Iterator of text deltas decoded after ``prefill`` by ``runner``; ``result`` is set once it
    is exhausted. ``eos_token_ids``: the model's, used unless ``cfg`` gives its own.

    The token loop is a state machine so that a scheduler can drive many streams with one
    batched decoding step (blendrag.serving): ``pending`` is the token whose next-token logits
    the stream needs (None once done) and ``advance(logits)`` takes them; iterating the stream
    decodes ``pending`` alone with ``runner.decode``. Both ways run the same text handling."""

    def __init__(self, runner: ModelRunner, tokenizer, eos_token_ids: set[int], prefill: Prefill,
                 cfg: GenerationConfig, on_done: Callable[[list[int]], None] | None = None,
                 threads: int | None = None) -> None:
        """``on_done(token_ids)``: called once the answer is done, with its tokens.
        ``threads``: torch's CPU threads while each token is decoded (engine/compute/threads.py)."""
        self.runner = runner
        self.threads = threads
        self.on_done = on_done
        self.tokenizer = tokenizer
        self.eos = set(cfg.eos_token_ids) if cfg.eos_token_ids is not None else eos_token_ids
        self.prefill = prefill
        self.cfg = cfg
        self.result: GenerationResult | None = None
        self.pending: int | None = None
        self._generator = make_generator(cfg, runner.device)
        self._ids: list[int] = []
        self._text, self._emitted = "", 0
        self._ready: list[str] = []  # deltas not yet handed out by iteration
        self._t_first = 0.0
        self._started = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        # per step, not for the stream's life: the caller's own work between tokens keeps
        # the caller's thread count
        while not self._ready:
            if not self._started:
                self._ready = self.start()
            elif self.pending is not None:
                with torch_threads(self.threads):
                    logits = self.runner.decode(self.pending, self.prefill.fused)
                self._ready = self.advance(logits)
            else:
                raise StopIteration
        return self._ready.pop(0)

    def start(self) -> list[str]:
        """The first token, from the prefill's logits: its text deltas (non-empty strings)."""
        if self._started:
            raise RuntimeError("the stream has started already")
        self._started = True
        with torch_threads(self.threads):
            token = next_token(self.prefill.logits, self.cfg, self._generator)
        self._t_first = time.perf_counter()
        return self._accept(token)

    def advance(self, logits: torch.Tensor) -> list[str]:
        """logits: [vocab], the next-token logits after ``pending`` -> the text deltas of the
        token chosen from them."""
        if self.pending is None:
            raise RuntimeError("the stream needs no logits: it has not started or is done")
        return self._accept(next_token(logits, self.cfg, self._generator))

    def advance_to(self, token: int) -> list[str]:
        """``advance`` with the token already chosen from this stream's logits as it would
        choose it (a greedy stream's argmax, taken by the caller for many streams at once: one
        read of the device for a batched step, not one per request) -> its text deltas."""
        if self.pending is None:
            raise RuntimeError("the stream needs no token: it has not started or is done")
        return self._accept(token)

    @property
    def greedy(self) -> bool:
        """Whether the next token is the logits' argmax."""
        return self.cfg.greedy

    def _accept(self, token: int) -> list[str]:
        self.pending = None
        cfg = self.cfg
        if token in self.eos:
            return self._finish("eos")
        self._ids.append(token)
        text = self.tokenizer.decode(self._ids, skip_special_tokens=True)
        cut = _first_stop(text, cfg.stop)
        if cut is not None:
            self._text = text[:cut]
            return self._finish("stop")
        self._text = text
        safe = _safe_end(text, cfg.stop) if cfg.stream_holdback else len(text)
        out: list[str] = []
        if safe > self._emitted:
            out.append(text[self._emitted:safe])
            self._emitted = safe
        if len(self._ids) >= cfg.max_new_tokens:
            return out + self._finish("length")
        self.pending = token
        return out

    def _finish(self, reason: str) -> list[str]:
        """The answer is done: the stats, ``result``, ``on_done``; the text not yet handed out."""
        tail = [self._text[self._emitted:]] if len(self._text) > self._emitted else []
        self._emitted = len(self._text)
        stats = self.prefill.stats
        stats.decode.new_tokens = len(self._ids)
        stats.decode.decode_s = time.perf_counter() - self._t_first
        stats.decode.finish_reason = reason
        self.result = GenerationResult(text=self._text, token_ids=list(self._ids),
                                       finish_reason=reason, stats=stats)
        if self.on_done is not None:
            self.on_done(self._ids)
        return tail


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _safe_end(text: str, stops: tuple[str, ...]) -> int:
    """Length of ``text`` that can be emitted now: not an incomplete UTF-8 character, and not a
    tail that may grow into a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[end - k:end] == s[:k]:
                hold = max(hold, k)
                break
    return end - hold


# ---- the next token ---------------------------------------------------------------------

def make_generator(cfg: GenerationConfig, device: torch.device) -> torch.Generator | None:
    """The seeded generator sampling draws from (None: greedy)."""
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
