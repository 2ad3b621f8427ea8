"""Cross-framework contract: the same prefix, chunks and suffix through LangChain's and
LlamaIndex's integration give the same rendered prompt, the same PromptLayout and the same
answer; both expose the same settings, chunk format and embedder."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import PromptTemplate as LCPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler  # noqa: E402
from llama_index.core.prompts import PromptTemplate as LIPromptTemplate  # noqa: E402

from blendrag import BlendEngine  # noqa: E402
from blendrag import langchain as lc  # noqa: E402
from blendrag import llamaindex as li  # noqa: E402
from blendrag.integration.settings import BlendSettings  # noqa: E402
from blendrag.integration.text_index import ChunkTextIndex  # noqa: E402
from blendrag.langchain.llm import format_documents  # noqa: E402
from helpers.li_data import ingest  # noqa: E402
from helpers.tiny import PASSAGES  # noqa: E402

PREFIX = "Answer from the passages below.\n"
QUESTION = "Who was born first?"
CHUNKS = [p.strip() for p in PASSAGES[:3]]


class PromptCollector(BaseCallbackHandler):
    def __init__(self) -> None:
        self.prompts: list[str] = []

    def on_llm_start(self, serialized, prompts, **kwargs) -> None:
        self.prompts.extend(prompts)


@pytest.fixture(params=[False, True], ids=["plain", "chat"])
def engine(request, model_dir) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=request.param,
                                       chunk_prefix="")


def _langchain(engine: BlendEngine, index: ChunkTextIndex) -> tuple[str, object, str]:
    """(rendered prompt, layout, answer) of LangChain's blend retrieval chain."""
    llm = lc.BlendLLM(engine=engine, text_index=index, max_tokens=4)
    retriever = RunnableLambda(lambda _: [Document(page_content=c) for c in CHUNKS])
    prompt = LCPromptTemplate.from_template(PREFIX + "{context}\nQuestion: {input}\nAnswer:")
    collector = PromptCollector()
    out = lc.create_blend_retrieval_chain(retriever, llm, prompt).invoke(
        {"input": QUESTION}, config={"callbacks": [collector]}
    )
    return collector.prompts[-1], llm.last_prompt.layout, out["answer"]


def _llamaindex(engine: BlendEngine, index: ChunkTextIndex) -> tuple[str, object, str]:
    """(rendered prompt, layout, answer) of LlamaIndex's BlendSynthesizer."""
    debug = LlamaDebugHandler()
    llm = li.BlendLLM(engine, text_index=index, max_tokens=4,
                      callback_manager=CallbackManager([debug]))
    template = LIPromptTemplate(PREFIX + "{context_str}\nQuestion: {query_str}\nAnswer:")
    answer = li.BlendSynthesizer(llm=llm, text_qa_template=template).get_response(QUESTION, CHUNKS)
    start = debug.get_event_pairs(CBEventType.LLM)[-1][0]
    return start.payload[EventPayload.PROMPT], llm.last_prompt.layout, answer


def test_same_chunks_give_the_same_prompt_layout_and_answer(engine):
    lc_text, lc_layout, lc_answer = _langchain(engine, ChunkTextIndex())
    li_text, li_layout, li_answer = _llamaindex(engine, ChunkTextIndex())
    assert lc_text == li_text == PREFIX + "\n\n".join(CHUNKS) + f"\nQuestion: {QUESTION}\nAnswer:"
    assert lc_layout == li_layout
    assert [engine.tokenizer.decode(c) for c in lc_layout.chunk_ids] == [
        CHUNKS[0],
        "\n\n",
        CHUNKS[1],
        "\n\n",
        CHUNKS[2],
    ]
    assert lc_answer == li_answer


def test_flat_prompts_find_the_same_ingested_chunks(engine):
    index = ChunkTextIndex()
    li_llm = li.BlendLLM(engine, text_index=index, max_tokens=4)
    assert ingest(li_llm, CHUNKS) == len(CHUNKS)  # LlamaIndex's hook records the texts in the index
    lc_llm = lc.BlendLLM(engine=engine, text_index=index, max_tokens=4)
    prompt = PREFIX + "\n\n".join(CHUNKS) + f"\nQuestion: {QUESTION}\nAnswer:"
    lc_answer = lc_llm.invoke(prompt)
    li_answer = li_llm.complete(prompt).text
    assert lc_llm.last_prompt.source == li_llm.last_prompt.source == "index"
    assert lc_llm.last_prompt.layout == li_llm.last_prompt.layout and lc_answer == li_answer
    # separators too
    hits = lc_llm.last_stats.cache.chunk_hits
    assert hits == li_llm.last_stats.cache.chunk_hits == 2 * len(CHUNKS) - 1


def test_one_config_shape_one_chunk_format_one_embedder(model_dir):
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         chunk_prefix="")
    lc_llm, li_llm = lc.BlendLLM(engine=engine), li.BlendLLM(engine)
    for cls in (lc.BlendLLM, lc.ChatBlend, li.BlendLLM):
        assert set(BlendSettings.model_fields) <= set(cls.model_fields)
    assert lc_llm.settings() == li_llm.settings()
    assert (
        lc_llm.blend_config() == li_llm.blend_config()
        and lc_llm.generation_config() == li_llm.generation_config()
    )
    text = "A passage {with braces}."
    assert format_documents([Document(page_content=text)], lc_llm.document_prompt) == [
        li_llm.client.chunk_format.format(text)]
    assert (
        inspect.signature(lc.create_blend_retrieval_chain).parameters["document_separator"].default
        == li_llm.chunk_separator == lc_llm.client.chunk_format.separator
    )
    lc_embed, li_embed = lc.SentenceTransformerEmbeddings, li.SentenceTransformerEmbeddings
    assert lc_embed.__name__ == li_embed.__name__
    assert inspect.signature(lc_embed).parameters["normalize"].default is \
        inspect.signature(li_embed).parameters["normalize"].default is True
