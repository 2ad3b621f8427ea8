"""Host time of a flat prompt's layout (what the LangChain and LlamaIndex LLMs do before the
model runs): find the passages, tokenize the prompt as one string and cut it, on the default
model's tokenizer; the median of 200 calls after 20 warm ones, one thread.

    .venv/bin/python scripts/flat_layout_time.py
"""

from __future__ import annotations

import statistics
import time

import torch

from blendrag import BlendEngine
from blendrag.integration.flat_prompt import flat_layout
from blendrag.integration.text_index import ChunkTextIndex

INSTRUCTION = "Read the passages and answer the question.\n\n"


def main() -> None:
    torch.set_num_threads(1)
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct", device="cpu",
                                         chunk_prefix=INSTRUCTION)
    docs = [f"Passage {i}: " + "the quick brown fox jumps over the lazy dog near the river "
            "bank. " * 8 for i in range(6)]
    prompt = INSTRUCTION + "\n\n".join(docs) + "\n\nQuestion: what?\nAnswer:"
    index = ChunkTextIndex()
    index.record(docs)
    for _ in range(20):
        flat_layout(engine.prompts, prompt, index)
    took = []
    for _ in range(200):
        t0 = time.perf_counter()
        flat_layout(engine.prompts, prompt, index)
        took.append(time.perf_counter() - t0)
    tokens = len(engine.prompts.whole(prompt).ids)
    print(f"flat layout of a {tokens}-token prompt: median {statistics.median(took) * 1e3:.3f} "
          "ms")


if __name__ == "__main__":
    main()
