"""Fidelity, answer quality and TTFT of every prefill mode and selector on a dataset.

Per item: build the layout (pieces tokenized separately), precompute the chunk KVs (ingestion,
not timed), then for each config: greedy decoding of the answer (up to the first line break
after some text for QA F1 items), then what a user sees first: whether the answer is full
prefill's (normalized text), the answer KL (KL(full || mode) at every token of full's answer,
teacher-forced: ``blendrag.eval.answer``), its quality (the item's metric) and exact match;
then the first-token columns (argmax agreement, KL(full || mode) of the first token) and the
TTFT (chunk KV fetch + prefill + first token). Per config: means over items, median TTFT and
the speedup over full prefill (median full TTFT / median TTFT).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine.engine import BlendEngine
from blendrag.eval.answer import compare_answers
from blendrag.eval.metrics import exact_match, score
from blendrag_bench.datasets import EvalItem, fit_tokens, kinds
from blendrag_bench.flows import BenchFlow, Flow
from blendrag_bench.quality_config import FULL, QualityConfig

log = logging.getLogger(__name__)

DEFAULT_QUALITY = QualityConfig()
RECORD_KEYS = ("mode", "selector", "ratio", "same_answer", "answer_kl", "quality", "exact_match",
               "first_token_agreement", "kl", "ttft_s", "speedup_vs_full", "recompute_fraction",
               "compute_fraction", "n", "quality_by_kind")
"""Keys of one JSON record (``ConfigSummary.record``)."""
NO_GOLD = float("nan")  # quality of an item without gold answers


@dataclass(frozen=True)
class ExampleResult:
    """One item under one config."""

    item: int
    kind: str
    config: BlendConfig
    answer: str
    same_answer: float  # 1.0 when the normalized answer is full prefill's
    answer_kl: float  # mean KL(full || mode) over full's answer tokens, teacher-forced
    quality: float
    exact_match: float
    first_token_agreement: float
    kl: float
    ttft_s: float
    recompute_fraction: float
    compute_fraction: float = 1.0


@dataclass(frozen=True)
class ConfigSummary:
    """One config aggregated over the items (``selector`` / ``ratio`` are None outside blend)."""

    mode: str
    selector: str | None
    ratio: float | None
    same_answer: float
    answer_kl: float
    quality: float
    exact_match: float
    first_token_agreement: float
    kl: float
    ttft_s: float
    speedup_vs_full: float
    recompute_fraction: float
    compute_fraction: float
    n: int
    quality_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.mode if self.selector is None else f"{self.mode}-{self.selector}@{self.ratio:g}"

    def record(self) -> dict:
        """The JSON record: exactly ``RECORD_KEYS``."""
        return {key: getattr(self, key) for key in RECORD_KEYS}


@dataclass(frozen=True)
class QualityReport:
    """Everything one run measured."""

    model: str
    dataset: str
    device: str
    dtype: str
    items: int
    skipped: int
    kinds: list[str]
    metrics: list[str]
    summaries: list[ConfigSummary]
    examples: list[ExampleResult]
    ingest_order: str = "prompt"
    profile_neighbours: int = 1
    flow: str = ""
    """How prompts were laid out and chunk KVs stored (``Flow.describe``)."""
    used: list[EvalItem] = field(default_factory=list)
    """The items evaluated, in order: an example's ``item`` indexes them."""


def load_engine(config: QualityConfig, chunk_prefix: str | None = None) -> BlendEngine:
    """The model to evaluate (the demo model was trained on plain prompts: no chat template
    unless asked for), with ``chunk_prefix`` (``BlendEngine``'s)."""
    chat = False if config.chat is None and config.model == "demo" else config.chat
    return BlendEngine.from_pretrained(config.model, dtype=config.dtype, device=config.device,
                                       chat=chat, gguf_file=config.gguf_file, threads=None,
                                       chunk_prefix=chunk_prefix)


def fit_item(engine: BlendEngine, item: EvalItem, max_chunk_tokens: int | None) -> EvalItem:
    """``item`` with each chunk cut to ``max_chunk_tokens`` tokens of the engine's tokenizer."""
    if max_chunk_tokens is None:
        return item
    count = lambda text: len(engine.prompts.encode(text))  # noqa: E731
    chunks = tuple(fit_tokens(c, max_chunk_tokens, count) for c in item.chunks)
    return item if chunks == item.chunks else dataclasses.replace(item, chunks=chunks)


def _generation(item: EvalItem, config: QualityConfig) -> GenerationConfig:
    short = item.metric != "rouge_l"  # only summaries need long answers
    return GenerationConfig(
        max_new_tokens=config.max_new_tokens if short else config.summary_max_new_tokens
    )


def evaluate_item(engine: BlendEngine, index: int, item: EvalItem, config: QualityConfig,
                  warmup: bool = False, flow: Flow | None = None) -> list[ExampleResult]:
    """Every config on one item, laid out and ingested by ``flow`` (default: ``BenchFlow``);
    the chunk KVs are precomputed first (untimed)."""
    flow = flow if flow is not None else BenchFlow(engine, config)
    layout = flow.layout(item)
    flow.ingest(index, item, layout)
    configs = config.configs()
    if warmup:
        for cfg in configs:
            engine.prefill(layout, cfg)
    gen = _generation(item, config)
    compared = compare_answers(engine, layout, configs, gen.max_new_tokens,
                               first_line=item.metric == "qa_f1")  # configs start with full
    return [ExampleResult(
        item=index, kind=item.kind, config=c.config, answer=c.answer.text,
        same_answer=float(c.same_answer), answer_kl=c.answer_kl,
        quality=score(item.metric, c.answer.text, item.answers) if item.answers else NO_GOLD,
        exact_match=exact_match(c.answer.text, item.answers) if item.answers else NO_GOLD,
        first_token_agreement=float(c.first_token_agrees), kl=c.first_token_kl,
        ttft_s=c.stats.timing.ttft_s, recompute_fraction=c.stats.recompute_fraction,
        compute_fraction=c.stats.compute_fraction) for c in compared]


def _fits(engine: BlendEngine, item: EvalItem, config: QualityConfig, flow: Flow) -> bool:
    try:
        engine.check_length(flow.layout(item), _generation(item, config).max_new_tokens)
    except ValueError as e:
        log.warning("skipping an item: %s", e)
        return False
    return True


def run_quality(items: Sequence[EvalItem], config: QualityConfig = DEFAULT_QUALITY,
                engine: BlendEngine | None = None, dataset: str = "synthetic",
                on_item: Callable[[int, int], None] | None = None,
                flow: Flow | None = None) -> QualityReport:
    """Evaluate every config of ``config`` on ``items``; ``engine`` defaults to
    ``load_engine(config)``, ``flow`` (how prompts are laid out and chunks ingested,
    ``blendrag_bench.flows``) to ``BenchFlow``. Items longer than the model's context are
    skipped (logged); ``on_item(done, total)`` is called after each item."""
    engine = engine if engine is not None else load_engine(config)
    flow = flow if flow is not None else BenchFlow(engine, config)
    items = [fit_item(engine, item, config.max_chunk_tokens) for item in items]
    usable = [item for item in items if _fits(engine, item, config, flow)]
    if not usable:
        raise ValueError(f"no item of {dataset!r} fits the model's context ({len(items)} given)")
    examples: list[ExampleResult] = []
    for i, item in enumerate(usable):
        examples += evaluate_item(engine, i, item, config, config.warmup and i == 0, flow)
        if on_item is not None:
            on_item(i + 1, len(usable))
    return QualityReport(model=config.model_name, dataset=dataset, device=str(engine.device),
                         dtype=str(engine.dtype).removeprefix("torch."), items=len(usable),
                         skipped=len(items) - len(usable), kinds=kinds(usable),
                         metrics=list(dict.fromkeys(item.metric for item in usable)),
                         summaries=summarize(examples, config.configs()), examples=examples,
                         ingest_order=config.ingest_order,
                         profile_neighbours=config.profile_neighbours, flow=flow.describe(),
                         used=usable)


def summarize(examples: Sequence[ExampleResult],
              configs: Sequence[BlendConfig]) -> list[ConfigSummary]:
    """One summary per config (in ``configs`` order); speedups relative to full prefill."""
    by_config = {cfg: [e for e in examples if e.config == cfg] for cfg in configs}
    full_ttft = statistics.median(e.ttft_s for e in by_config[FULL])
    return [_summary(cfg, rows, full_ttft) for cfg, rows in by_config.items() if rows]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _summary(cfg: BlendConfig, rows: list[ExampleResult], full_ttft: float) -> ConfigSummary:
    blend = cfg.mode == "blend"
    ttft = statistics.median(e.ttft_s for e in rows)
    by_kind = {
        k: _mean([e.quality for e in rows if e.kind == k])
        for k in dict.fromkeys(e.kind for e in rows)
    }
    return ConfigSummary(
        # the selector as its label names it (``preview/span4``: a variant is a series of its own)
        # a variant (``preview/span4``, ``preview+ape0.9x1``) is a series of its own
        mode=cfg.mode, selector=cfg.variant if blend else None,
        ratio=cfg.ratio if blend else None,
        same_answer=_mean([e.same_answer for e in rows]),
        answer_kl=_mean([e.answer_kl for e in rows]),
        quality=_mean([e.quality for e in rows]), exact_match=_mean([e.exact_match for e in rows]),
        first_token_agreement=_mean([e.first_token_agreement for e in rows]),
        kl=_mean([e.kl for e in rows]),
        ttft_s=ttft, speedup_vs_full=full_ttft / ttft if ttft > 0 else float("inf"),
        recompute_fraction=_mean([e.recompute_fraction for e in rows]),
        compute_fraction=_mean([e.compute_fraction for e in rows]), n=len(rows),
        quality_by_kind=by_kind)
