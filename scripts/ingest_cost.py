"""What the ingestion context costs at ingestion: time and stored bytes per context.

    python scripts/ingest_cost.py

Ingests the demo's 20 real passages (``blendrag_demo``'s corpus, 319-405 tokens each) on
SmolLM2-135M-Instruct into a fresh RAM store, once per context: chunks alone (``NO_CONTEXT``),
the earlier default (two one-passage fillers, first passage averaged) and today's default
(three two-passage fillers, the first passage's exact rows stored too). Prints seconds, chunk
forwards per passage and the store's bytes (filler prefixes included).
"""

from __future__ import annotations

import argparse
import time

import torch

from blendrag import NO_CONTEXT, BlendEngine, ChunkContext, MemoryKVStore
from blendrag.engine.caches.context import PASSAGES
from blendrag_demo.corpora import real_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = BlendEngine.from_pretrained("smollm2-135m-instruct")
    corpus = real_corpus()
    texts = [f"{p.text}\n\n" for p in corpus.passages]  # as the demo's chunk format
    contexts = {
        "chunks alone": NO_CONTEXT,
        "2 fillers of 1 passage (earlier default)": ChunkContext(PASSAGES[:2], exact_first=False),
        "3 fillers of 2 + exact first (default)": ChunkContext(),
    }
    print(f"{len(texts)} passages, SmolLM2-135M-Instruct, {args.threads} thread(s)\n")
    print("| context | chunk forwards per passage | seconds | stored MB |\n|---|---:|---:|---:|")
    for name, context in contexts.items():
        store = MemoryKVStore()
        engine = BlendEngine(base.model, base.tokenizer, store=store, context=context)
        engine.ingest(texts[:1], corpus.prefix)  # the filler prefixes, a warm-up: untimed
        t0 = time.perf_counter()
        engine.ingest(texts[1:], corpus.prefix)
        seconds = (time.perf_counter() - t0) * len(texts) / (len(texts) - 1)
        forwards = len(context.fillers) + 1 if context.fillers else 1
        mb = store.usage().used_bytes / 1e6
        print(f"| {name} | {forwards} | {seconds:.1f} | {mb:.1f} |", flush=True)


if __name__ == "__main__":
    main()
