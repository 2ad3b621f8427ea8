"""A request that finds no known chunk: one warning per LLM naming the cause and the fix, a
counter, ``strict`` raising instead, and the answer's metadata saying it did not blend."""

from __future__ import annotations

import logging

import pytest
from langchain_core.documents import Document

from blendrag.integration.fallback import NoChunkFoundError
from helpers.lc_data import PASSAGES, QUESTION, TEMPLATE

PROMPT = TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input=QUESTION)
WARNING = "found no known chunk"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and WARNING in r.getMessage()]


def _stock_chain(store, llm, prompt):
    from langchain_classic.chains import create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain

    combine = create_stuff_documents_chain(llm, prompt)
    return create_retrieval_chain(store.as_retriever(search_kwargs={"k": 3}), combine)


def test_plain_chroma_store_warns_once_counts_and_strict_raises(llm, embedder, chroma_client,
                                                                collection_name, documents,
                                                                prompt, caplog):
    pytest.importorskip("langchain_chroma")
    from langchain_chroma import Chroma

    store = Chroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                  collection_name=collection_name)
    chain = _stock_chain(store, llm, prompt)
    with caplog.at_level(logging.WARNING):
        chain.invoke({"input": QUESTION})
        chain.invoke({"input": QUESTION})
    (message,) = _warnings(caplog)
    assert "text index is empty" in message and "BlendChroma" in message
    assert llm.fallbacks == 2 and llm.last_stats.mode == "full"
    assert llm.last_prompt.fallback == "empty_index"

    strict = llm.model_copy(update={"strict": True})
    with pytest.raises(NoChunkFoundError, match="text index is empty.*BlendChroma"):
        _stock_chain(store, strict, prompt).invoke({"input": QUESTION})


def test_ingested_texts_missing_from_the_prompt(llm, caplog):
    llm.text_index.record(PASSAGES)
    with caplog.at_level(logging.WARNING):
        result = llm.generate(["Tell me about the quick brown fox near the river bank."])
    info = result.generations[0][0].generation_info
    assert info["blended"] is False and info["blendrag"]["mode"] == "full"
    assert info["blendrag_prompt"]["fallback"] == "not_in_prompt"
    (message,) = _warnings(caplog)
    assert f"none of the {len(PASSAGES)} ingested chunk texts" in message
    assert "document_prompt" in message
    with pytest.raises(NoChunkFoundError, match="document_prompt"):
        llm.model_copy(update={"strict": True}).invoke("Tell me about the fox.")


def test_documents_not_in_the_prompt(llm, caplog):
    docs = [Document(page_content="A passage that the prompt does not contain at all.")]
    with caplog.at_level(logging.WARNING):
        llm.invoke("What is in the passage? Nothing is quoted here.", documents=docs)
    assert llm.last_prompt.fallback == "documents_not_in_prompt" and llm.fallbacks == 1
    assert "retrieved texts is in the prompt verbatim" in _warnings(caplog)[0]


def test_asking_for_full_is_not_a_fallback(llm, caplog):
    with caplog.at_level(logging.WARNING):
        result = llm.generate(["A prompt with no chunk in it at all."], mode="full")
    info = result.generations[0][0].generation_info
    assert _warnings(caplog) == [] and llm.fallbacks == 0
    assert info["blended"] is False and info["blendrag_prompt"]["fallback"] is None


def test_chat_metadata_says_whether_it_blended(engine):
    from langchain_core.messages import HumanMessage

    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=engine, max_tokens=4)
    message = chat.invoke([HumanMessage(PROMPT)], documents=[Document(p) for p in PASSAGES[:3]])
    meta = message.response_metadata
    assert meta["blended"] is True and meta["blendrag_prompt"]["matched_chunks"] == 3
    assert meta["blendrag"]["chunk_hits"] + meta["blendrag"]["chunk_misses"] == 5
    assert meta["blendrag"]["ttft_s"] > meta["blendrag"]["match_s"] > 0
    message = chat.invoke([HumanMessage("Nothing known here.")])
    assert message.response_metadata["blended"] is False and chat.fallbacks == 1


def test_the_answers_metadata_carries_the_calibration_the_default_ran_with(engine):
    from blendrag.langchain import BlendLLM
    from blendrag.store.calibration import CalibrationRecord, FrontierPoint

    engine.use_calibration(CalibrationRecord(
        engine.model_fp, engine.tokenizer_fp, "c" * 64, "epic", 0.4,
        {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32, "first_sentence": False},
        (FrontierPoint("epic", 0.4, 0.93, 0.008, 2.4),), "flow words", 24, 10.0))
    llm = BlendLLM(engine=engine, max_tokens=4)  # selector and ratio left to the calibration
    llm.text_index.record(PASSAGES[:3])
    result = llm.generate([TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input=QUESTION)])
    info = result.generations[0][0].generation_info["blendrag"]
    assert (info["selector"], info["ratio"]) == ("epic", 0.4)
    assert info["calibration"]["same_answer"] == 0.93
    assert info["calibration"]["answer_kl"] == 0.008


def test_a_request_in_another_namespace_is_told_where_it_looked(llm, caplog):
    """Texts ingested in the default namespace are not another namespace's: the warning says
    which namespace the request looked in, not only that its index is empty."""
    llm.text_index.record(PASSAGES)
    with caplog.at_level(logging.WARNING):
        llm.invoke(PROMPT, namespace="acme")
    (message,) = _warnings(caplog)
    assert "its text index is empty" in message and "in namespace 'acme'" in message
