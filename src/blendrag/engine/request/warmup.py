"""Warm-up: what a process pays once, paid at load instead of by its first requests.

A new process's first request of each mode pays for things no later request does: kernels
compiled (FlexAttention for blend's scattered queries on a GPU: about 10 s), the decoding step
captured as a CUDA graph for its buffer, the device's cost profile timed
(engine/selection/costs.py), the allocator's first large blocks. ``warm_up`` runs each
configured mode on a synthetic RAG prompt of each configured size, twice (the first run
finds its chunks in no store: as a first question does by default, it runs a full prefill and
the backfill computes them, ``LoadingConfig.full_when_missing``, or it computes them itself;
the second takes them from the store, as a warm request does), decodes a few tokens after it,
and reports what each step took. Before that it loads the compiler's
caches that an earlier process kept (``compile_cache.py``) and after it keeps them, so that a
second process warms up in a fraction of the first one's time.

The requests run on a *sandbox*: the engine's model and runner with a private in-memory store
and no prefix or history cache (the facade makes it: ``BlendEngine.warmup``), so warm-up
writes nothing to the user's store and leaves nothing in the caches a request reads. The cost
profile and the loading controller do learn from the warm-up requests: that is what they are
for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from blendrag.config import DEFAULT_GENERATION, BlendConfig
from blendrag.engine.compute import compile_cache
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.static_pass import CAPTURE_AT
from blendrag.engine.request.prefill import Prefill
from blendrag.prompt import PromptLayout

WARMUP_CONFIGS = (BlendConfig(mode="full"), BlendConfig(mode="prefix"),
                  BlendConfig(mode="reuse"),
                  BlendConfig(mode="blend", selector="preview", ratio=0.2),
                  BlendConfig(mode="blend", selector="epic", ratio=0.15))
PREFIX_TOKENS = 8


@dataclass(frozen=True)
class WarmupConfig:
    """What warm-up runs.

    prompt_tokens:  the prompt sizes each mode runs at (a typical RAG prompt by default)
    chunks:         retrieved chunks in each prompt
    suffix_tokens:  the question and answer cue after them
    configs:        the modes run (each at each size)
    decode_tokens:  tokens decoded after each warm run (the decoding step captured on a GPU)
    answer_tokens:  room for an answer in each warm run's KV buffer, as a request asking for
                    that many new tokens has: its buffer's size picks the passes captured for
                    it (default: ``GenerationConfig``'s ``max_new_tokens``)
    profile:        time the device's cost profile now (else at the first request that uses it)
    compile_cache:  the folder torch.compile's caches are loaded from and kept in (None: not
                    kept); trusted like the installed packages (``compile_cache.py``)
    """

    prompt_tokens: tuple[int, ...] = (3072,)
    chunks: int = 6
    suffix_tokens: int = 64
    configs: tuple[BlendConfig, ...] = WARMUP_CONFIGS
    decode_tokens: int = 2
    answer_tokens: int = DEFAULT_GENERATION.max_new_tokens
    profile: bool = True
    compile_cache: Path | None = field(default=compile_cache.DEFAULT_FOLDER)

    def __post_init__(self) -> None:
        if self.chunks < 1 or self.suffix_tokens < 1 or self.decode_tokens < 0:
            raise ValueError(f"WarmupConfig: chunks and suffix_tokens must be >= 1 and "
                             f"decode_tokens >= 0, got {self.chunks}, {self.suffix_tokens}, "
                             f"{self.decode_tokens}")
        if self.answer_tokens < self.decode_tokens:
            raise ValueError(f"WarmupConfig.answer_tokens ({self.answer_tokens}) must hold the "
                             f"{self.decode_tokens} decode_tokens decoded after each warm run")
        least = PREFIX_TOKENS + self.chunks + self.suffix_tokens
        for n in self.prompt_tokens:
            if not isinstance(n, int) or n < least:
                raise ValueError(f"WarmupConfig.prompt_tokens: {n!r} cannot hold an "
                                 f"{PREFIX_TOKENS}-token prefix, {self.chunks} chunks and a "
                                 f"{self.suffix_tokens}-token suffix (at least {least})")
        if not self.configs:
            raise ValueError("WarmupConfig.configs is empty: give at least one mode to run")


@dataclass
class WarmupReport:
    """What warm-up took: ``seconds`` in all, each step's seconds (``steps``: "profile",
    "<mode> <tokens> cold" / "warm"), the compiler cache's bytes ``loaded`` and ``saved``."""

    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    loaded: int = 0
    saved: int = 0

    def summary(self) -> str:
        """One line: the total, the slowest step, the compile cache."""
        slowest = max(self.steps.items(), key=lambda kv: kv[1], default=("none", 0.0))
        return (f"warm-up {self.seconds:.2f} s ({len(self.steps)} steps, slowest: "
                f"{slowest[0]} {slowest[1]:.2f} s); compile cache: {self.loaded} bytes "
                f"loaded, {self.saved} bytes kept")


PrefillFn = Callable[[PromptLayout, BlendConfig, int], Prefill]


def warm_up(runner: ModelRunner, prefill: PrefillFn, vocab: int, config: WarmupConfig,
            settle: Callable[[], object] = lambda: None) -> WarmupReport:
    """Run ``config``'s warm-up through ``prefill`` (the sandbox's: module docstring) on
    ``runner``, prompts of random ids below ``vocab``; ``settle`` (untimed) after each cold
    run: waits for the chunks its backfill is computing, which the warm run takes."""
    report, t0 = WarmupReport(), time.perf_counter()
    folder = config.compile_cache
    if folder is not None:
        report.loaded = compile_cache.load(folder, runner.device)
    if config.profile:
        report.steps["profile"] = _timed(runner, runner.costs)
    for n in config.prompt_tokens:
        layout = synthetic_layout(n, config.chunks, config.suffix_tokens, vocab)
        for blend in config.configs:
            label = f"{blend.label} {n}"
            report.steps[f"{label} cold"] = _timed(runner, partial(prefill, layout, blend,
                                                                    config.answer_tokens))
            settle()
            report.steps[f"{label} warm"] = _timed(runner, partial(
                _warm, runner, prefill, layout, blend, config.decode_tokens,
                config.answer_tokens))
    if folder is not None:
        report.saved = compile_cache.save(folder, runner.device)
    report.seconds = time.perf_counter() - t0
    return report


def synthetic_layout(tokens: int, chunks: int, suffix: int, vocab: int) -> PromptLayout:
    """A ``tokens``-token prompt: an 8-token prefix, ``chunks`` chunks sharing the rest
    (the first ones one token longer), a ``suffix``-token question; ids drawn at random (fixed
    seed) from [3, vocab), away from the usual special ids."""
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(3, max(vocab, 4), (tokens,), generator=g).tolist()
    body = tokens - PREFIX_TOKENS - suffix
    sizes = [body // chunks + (i < body % chunks) for i in range(chunks)]
    at, pieces = PREFIX_TOKENS, []
    for size in sizes:
        pieces.append(ids[at:at + size])
        at += size
    return PromptLayout(ids[:PREFIX_TOKENS], pieces, ids[at:])


def _warm(runner: ModelRunner, prefill: PrefillFn, layout: PromptLayout, config: BlendConfig,
          tokens: int, room: int) -> None:
    """A warm request: ``layout``'s chunks stored, the prefill with ``room`` rows for its
    answer, then ``tokens`` decoded. With static passes the prefill runs again while its passes
    are warming (on CUDA a shape seen once runs the layer loop, the second time it is captured:
    engine/compute/static_pass.py), here rather than in a user's request, and once more at its
    steady state: the first time the cost profile learns what the mode takes beyond its passes
    (``costs.observe_choice`` counts no warming request)."""
    pre = prefill(layout, config, room)
    for _ in range(CAPTURE_AT if runner.static_passes is not None else 0):
        if not pre.stats.compute.warming_passes:
            break
        del pre  # its buffer free for the next prefill
        pre = prefill(layout, config, room)
    token = int(pre.logits.argmax())
    for _ in range(tokens):
        token = int(runner.decode(token, pre.fused).argmax())


def _timed(runner: ModelRunner, fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    if runner.device.type == "cuda":  # this thread's stream: see prefill.py ``_sync``
        torch.cuda.current_stream(runner.device).synchronize()
    return time.perf_counter() - t0
