"""`blendrag bench match`: time to find the ingested chunks in a flat prompt, by index size.

A framework LLM that gets a flat prompt (a stock chain's) finds the chunk texts in it with
``ChunkTextIndex.find`` before every prefill. This measures that call for indexes of growing
size: synthetic chunk texts (distinct, of ``chunk_chars`` characters, cut from one random-word
corpus so that they share words and heads), and a prompt of ``prompt_chars`` characters holding
``prompt_chunks`` of them between an instruction and a question. Also reported: time to build
the index, the memory it holds (RSS growth) and whether every chunk of the prompt was found.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import random
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from blendrag.integration.text_index import ChunkTextIndex

_WORDS = ("the of and to in is was for on that with as by at from his her an which are were "
          "this be had not first city river born team year war world national school new "
          "university county state population album season film village district church "
          "station league game series party government music company football").split()


@dataclass(frozen=True)
class MatchBenchConfig:
    """``sizes``: indexed chunk counts; ``prompt_chars``: the prompt's length (4 characters
    per token: 16,000 for a 4,000-token prompt); ``repeats``: timed ``find`` calls per size."""

    sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    chunk_chars: int = 400
    prompt_chars: int = 16_000
    prompt_chunks: int = 8
    repeats: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < self.prompt_chunks:
            raise ValueError(f"every size must be >= prompt_chunks ({self.prompt_chunks}), got "
                             f"{self.sizes}")
        if self.chunk_chars < 32:
            raise ValueError(f"chunk_chars must be >= 32, got {self.chunk_chars}")
        if self.prompt_chunks < 1 or self.repeats < 1:
            raise ValueError("prompt_chunks and repeats must be >= 1")
        if self.prompt_chars < self.prompt_chunks * (self.chunk_chars + 2):
            raise ValueError(f"prompt_chars ({self.prompt_chars}) cannot hold {self.prompt_chunks}"
                             f" chunks of {self.chunk_chars} characters")


@dataclass(frozen=True)
class MatchRecord:
    indexed: int
    build_s: float
    memory_mib: float
    find_median_ms: float
    find_p90_ms: float
    found: int
    expected: int


def _corpus(cfg: MatchBenchConfig) -> str:
    rng = random.Random(cfg.seed)
    words = rng.choices(_WORDS, k=(cfg.chunk_chars * 40) // 5)
    return " ".join(words)


def _chunk(corpus: str, i: int, n: int) -> str:
    """Chunk i: a unique head, then corpus text from a position that depends on i."""
    head = f"Passage {i}: "
    start = (i * 7919) % (len(corpus) - n)
    return (head + corpus[start:start + n])[:n]


def _rss_mib() -> float:
    """Resident memory, after handing freed heap pages back (glibc), so that the temporaries
    of building the index do not count as its size."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS includes freed pages
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _prompt(cfg: MatchBenchConfig, corpus: str, picked: list[int]) -> tuple[str, int]:
    chunks = "\n\n".join(_chunk(corpus, i, cfg.chunk_chars) for i in picked)
    head = "Answer the question from the passages below.\n\n"
    question = "\n\nQuestion: which passage names the oldest station?\nAnswer:"
    filler = cfg.prompt_chars - len(head) - len(chunks) - len(question)
    notes = ("Notes: " + corpus)[:max(filler - 2, 0)] + "\n\n" if filler > 2 else ""
    return head + notes + chunks + question, len(picked)


def run_size(cfg: MatchBenchConfig, size: int) -> MatchRecord:
    corpus = _corpus(cfg)
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    index = ChunkTextIndex()
    step = 20_000
    for start in range(0, size, step):
        index.record([_chunk(corpus, i, cfg.chunk_chars)
                        for i in range(start, min(size, start + step))])
    build_s = time.perf_counter() - t0
    memory = _rss_mib() - rss0
    rng = random.Random(cfg.seed + size)
    prompt, expected = _prompt(cfg, corpus, rng.sample(range(size), cfg.prompt_chunks))
    found = len(index.find(prompt))
    times = []
    for _ in range(cfg.repeats):
        t = time.perf_counter()
        index.find(prompt)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return MatchRecord(indexed=size, build_s=build_s, memory_mib=memory,
                       find_median_ms=statistics.median(times),
                       find_p90_ms=times[int(0.9 * (len(times) - 1))], found=found,
                       expected=expected)


def run(cfg: MatchBenchConfig) -> list[MatchRecord]:
    """Each size in a fresh process: its memory figure is its own index's, not the heap left
    over from a smaller one."""
    ctx = multiprocessing.get_context("spawn")
    records = []
    for n in cfg.sizes:
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            records.append(pool.submit(run_size, cfg, n).result())
    return records


def format_table(records: list[MatchRecord], cfg: MatchBenchConfig) -> str:
    lines = [f"prompt: {cfg.prompt_chars:,} characters (~{cfg.prompt_chars // 4:,} tokens), "
             f"{cfg.prompt_chunks} indexed chunks of {cfg.chunk_chars} characters in it; "
             f"{cfg.repeats} timed finds per size",
             "",
             "| indexed chunks | find median (ms) | find p90 (ms) | chunks found | build (s) "
             "| index memory (MiB) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r.indexed:,} | {r.find_median_ms:.3f} | {r.find_p90_ms:.3f} | "
                     f"{r.found}/{r.expected} | {r.build_s:.1f} | {r.memory_mib:.0f} |")
    return "\n".join(lines)


def write_json(records: list[MatchRecord], cfg: MatchBenchConfig, path: Path) -> None:
    path.write_text(json.dumps({"config": asdict(cfg), "records": [asdict(r) for r in records]},
                               indent=2))
