"""`bench fidelity` runs what the user's application runs: the integration flow lays a prompt
out with the very ids and chunk prefix LangChain's and LlamaIndex's BlendLLM use and stores
chunk KVs under the keys they read; the engine flow is `ingest` + `build_prompt`. A tiny random
model (tests/helpers/tiny.py); two passages, the separator between them a chunk of its own."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine
from blendrag.engine.caches.context import ChunkContext
from blendrag_bench.datasets import EvalItem
from blendrag_bench.fidelity import answer_lines, check_fidelity
from blendrag_bench.flows import EngineFlow, IntegrationFlow, make_flow
from blendrag_bench.report import format_markdown
from helpers.lc_data import PASSAGES

ITEM = EvalItem("Answer from the passages below.\n", tuple(PASSAGES[:2]),
                "\nQuestion: where was Messi born?\nAnswer:", ("Rosario",), kind="prompt",
                metric="contains")


@pytest.fixture
def engine_with(model_dir):
    """factory(chunk_prefix) -> a fresh engine (its own in-memory store) with the default
    ingestion context, as a user builds one."""
    def make(chunk_prefix: str | None) -> BlendEngine:
        return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                           chunk_prefix=chunk_prefix, context=ChunkContext())
    return make


def test_the_integration_flow_is_langchains_prompt_and_keys(engine_with):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnableLambda

    from blendrag.langchain import BlendLLM, create_blend_retrieval_chain

    bench = IntegrationFlow(engine_with(""))
    layout = bench.layout(ITEM)
    bench.ingest(0, ITEM, layout)
    # the chunk KVs are computed after the chunk prefix "", not after the prompt's own prefix
    assert layout.chunk_prefix_ids == tuple(bench.engine.prompts.encode("", first=True))
    assert layout.prefix_ids == tuple(bench.engine.prompts.encode(ITEM.prefix, first=True))
    # passages and the separator between them are chunks: 3 chunks
    assert [bench.engine.tokenizer.decode(c) for c in layout.chunk_ids] == [
        ITEM.chunks[0], "\n\n", ITEM.chunks[1]]

    user = engine_with("")  # the user's own engine, store and chain
    llm = BlendLLM(engine=user, max_tokens=2, mode="reuse")
    docs = [Document(page_content=c) for c in ITEM.chunks]
    user.ingest([*ITEM.chunks, "\n\n"])  # what BlendChroma.from_documents stores
    prompt = PromptTemplate.from_template(ITEM.prefix + "{context}" + ITEM.suffix)
    chain = create_blend_retrieval_chain(RunnableLambda(lambda _: docs), llm, prompt)
    chain.invoke({"input": "where?"})
    assert llm.last_prompt.layout == layout  # the same ids, piece by piece
    assert bench.prompt(ITEM) == prompt.format(context="\n\n".join(ITEM.chunks))
    # the keys the bench stored are those the chain's request reads
    keys = [user.key(layout.chunk_prefix_ids, ids) for ids in layout.chunk_ids]
    assert all(bench.engine.store.contains(k) for k in keys)
    assert all(user.store.contains(k) for k in keys)
    assert llm.last_stats.cache.chunk_hits == 3 and llm.last_stats.cache.chunk_misses == 0


def test_the_integration_flow_is_llamaindexs_prompt_and_ingestion(engine_with):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode

    from blendrag.llamaindex import BlendKVTransform, BlendLLM

    llm = BlendLLM(engine_with(""), max_tokens=2, mode="reuse")
    nodes = [TextNode(text=c) for c in ITEM.chunks]
    BlendKVTransform(llm)(nodes)  # the user's ingestion
    bench = make_flow("integration", llm.engine)  # on the same engine and store
    # the bench's ingestion finds every KV stored already: the same keys
    counts = bench.client.ingest(list(ITEM.chunks), progress=False)
    assert (counts.computed, counts.skipped) == (0, 2)
    layout = bench.layout(ITEM)
    llm.complete(bench.prompt(ITEM), nodes=nodes)
    assert llm.last_prompt.layout == layout  # the same ids, piece by piece
    assert llm.last_stats.cache.chunk_misses == 0  # the separator was stored too


def test_the_integration_flow_needs_a_chunk_prefix_as_the_integrations_do(engine_with):
    with pytest.raises(ValueError, match="build the engine with chunk_prefix"):
        IntegrationFlow(engine_with(None))
    with pytest.raises(ValueError, match="flow must be one of integration, engine"):
        make_flow("langchain", engine_with(""))


def test_the_engine_flow_is_ingest_and_build_prompt(engine_with):
    engine = engine_with(None)
    flow = EngineFlow(engine)
    layout = flow.layout(ITEM)
    assert layout == engine.build_prompt(ITEM.prefix, ITEM.chunks, ITEM.suffix)
    assert layout.chunk_prefix_ids == layout.prefix_ids  # each prompt's own prefix
    flow.ingest(0, ITEM, layout)
    assert engine.ingest(list(ITEM.chunks), prefix=ITEM.prefix) == [False, False]  # stored
    assert "after each prompt's own prefix" in flow.describe()
    canonical = EngineFlow(engine_with("Read:\n")).layout(ITEM)
    assert canonical.chunk_prefix_ids != canonical.prefix_ids


@pytest.mark.parametrize("flow, words", [
    ("integration", "flow `integration` (LangChain's and LlamaIndex's BlendLLM): prefix + the "
                    "chunks joined with '\\n\\n' + suffix, laid out by the integration client "
                    "(separators are chunks of their own), chunk KVs computed after the chunk "
                    "prefix ''; ingestion context: the default 3 filler contexts"),
    ("engine", "flow `engine` (BlendEngine.ingest + build_prompt): prefix + chunks + suffix as "
               "given, chunk KVs computed after each prompt's own prefix; ingestion context: "
               "the default 3 filler contexts")])
def test_the_report_says_what_ran_the_metric_and_the_answers(engine_with, flow, words):
    engine = engine_with("" if flow == "integration" else None)
    check = check_fidelity(engine, [ITEM], ("cacheblend",), (1.0,), max_new_tokens=3,
                           flow=flow, model="my-model")
    md = format_markdown(check.report)
    assert md.startswith("Quality vs TTFT: model `my-model`")  # the name given, not a path
    assert f"Ran: {words}" in md
    assert "| answer KL | quality (contains) | EM |" in md
    by = {s.label: s for s in check.report.summaries}
    assert by["blend-cacheblend@1"].same_answer == 1.0  # ratio 1.0 is a full prefill
    lines = answer_lines(check.report)
    full = next(e.answer for e in check.report.examples if e.config.mode == "full")
    assert lines[:3] == ["Answers:", "prompt 1: 'Question: where was Messi born?\\nAnswer:'; "
                                     "gold: Rosario", f"  full: {full!r}"]
    assert f"  blend-cacheblend@1: {full!r}  (= full)" in lines
