"""What a newcomer's own LangChain flows run into, each with the message that names the real
cause and the fix: a forgotten ingestion hook, a strict LLM, a chat model asked without
documents, a mistyped or foreign setting, a model name where an engine goes; and passage counts
that leave the separators out."""

from __future__ import annotations

import logging

import pytest

from blendrag.integration.fallback import NoChunkFoundError
from helpers.lc_data import QUESTION

K = 3


def _warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and needle in r.getMessage()]


def _blend_chain(store, llm, prompt):
    from blendrag.langchain import create_blend_retrieval_chain

    return create_blend_retrieval_chain(store.as_retriever(search_kwargs={"k": K}), llm, prompt)


def test_a_plain_chroma_behind_the_blend_chain_warns_once_that_nothing_was_ingested(
        llm, embedder, chroma_client, collection_name, documents, prompt, caplog):
    pytest.importorskip("langchain_chroma")
    from langchain_chroma import Chroma

    store = Chroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                  collection_name=collection_name)
    chain = _blend_chain(store, llm, prompt)
    with caplog.at_level(logging.WARNING):
        chain.invoke({"input": QUESTION})
        assert llm.last_prompt.passage_hits == 0 and llm.last_prompt.matched == K
        chain.invoke({"input": QUESTION})  # stored by the first: read now
    said = _warnings(caplog, "had a stored KV")
    assert len(said) == 1 and "none of the 3 passages" in said[0] and "BlendChroma" in said[0]
    assert llm.last_prompt.passage_hits == K


def test_by_default_the_first_question_never_waits_on_its_passages(
        llm, engine, embedder, chroma_client, collection_name, documents, prompt, caplog):
    """The default loading config (the fixture's engine opts out): the first question over a
    plain Chroma runs an exact full prefill, says so in numbers once, and the next one blends
    the passages the backfill stored meanwhile."""
    pytest.importorskip("langchain_chroma")
    from langchain_chroma import Chroma

    from blendrag.engine.selection.controller import LoadingConfig

    engine.loading = LoadingConfig()
    store = Chroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                  collection_name=collection_name)
    chain = _blend_chain(store, llm, prompt)
    with caplog.at_level(logging.WARNING):
        chain.invoke({"input": QUESTION})
        assert llm.last_prompt.matched == K and llm.last_stats.mode == "full"
        assert llm.last_stats.controller.mode.reason == "chunks missing"
        assert engine.cache.backfill.wait(timeout=120)  # stored off the first's path
        chain.invoke({"input": QUESTION})
    said = _warnings(caplog, "in no store yet")
    assert len(said) == 1 and "ran an exact full prefill" in said[0]
    assert llm.last_stats.mode == "blend" and llm.last_prompt.passage_hits == K
    # and the framework names the fix: the ingestion hook that was left out
    hook = _warnings(caplog, "had a stored KV")
    assert len(hook) == 1 and "none of the 3 passages" in hook[0]
    assert "computed in the background" in hook[0] and "BlendChroma" in hook[0]


def test_passage_hits_leave_the_separators_out(blend_store, llm, prompt, caplog):
    with caplog.at_level(logging.WARNING):
        _blend_chain(blend_store, llm, prompt).invoke({"input": QUESTION})
    # K passages and K-1 separators, all stored; the passages are K
    assert llm.last_stats.cache.chunk_hits == 2 * K - 1
    assert llm.last_prompt.passage_hits == K
    assert not _warnings(caplog, "had a stored KV")


def test_strict_says_it_refuses_rather_than_runs_a_full_prefill(engine, llm, blend_store):
    from blendrag.langchain import BlendLLM

    strict = BlendLLM(engine=engine, strict=True, max_tokens=4, text_index=llm.text_index)
    with pytest.raises(NoChunkFoundError) as info:
        strict.invoke("Tell me about the quick brown fox.")
    text = str(info.value)
    assert "BlendLLM(strict=True) refuses a prompt without a known chunk" in text
    assert "runs a plain full prefill" not in text


def test_a_chat_model_asked_without_documents_names_itself_and_the_real_cause(
        engine, blend_store, caplog):
    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=engine, max_tokens=4)
    with caplog.at_level(logging.WARNING):
        chat.invoke("hello")
    said = _warnings(caplog, "found no known chunk")
    assert len(said) == 1 and said[0].startswith("ChatBlend found no known chunk")
    assert "without retrieved passages is a full prefill by design" in said[0]
    assert "BlendLLM(" not in said[0]  # the class the user has is named, not another
    caplog.clear()
    full = ChatBlend(engine=engine, max_tokens=4, mode="full")
    with caplog.at_level(logging.WARNING):
        full.invoke("hello")
    assert not _warnings(caplog, "found no known chunk")


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_new_tokens": 3}, "'max_new_tokens' (did you mean 'max_tokens'?)"),
    ({"ratoi": 0.3}, "'ratoi' (did you mean 'ratio'?)"),
])
def test_an_unknown_setting_is_refused_naming_the_likely_one(engine, kwargs, needle):
    from blendrag.langchain import BlendLLM

    with pytest.raises(ValueError, match="BlendLLM has no setting") as info:
        BlendLLM(engine=engine, **kwargs)
    assert needle in str(info.value)


def test_langchains_remote_api_params_are_accepted(engine):
    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=engine, timeout=30, max_retries=2, max_tokens=5)
    assert chat.max_tokens == 5


def test_a_model_name_where_the_engine_goes_says_how_to_build_one():
    from blendrag.llamaindex import BlendLLM

    with pytest.raises(TypeError, match=r"BlendEngine.from_pretrained\('smollm2-135m-instruct'\)"):
        BlendLLM(engine="smollm2-135m-instruct")


def test_strict_per_call_raises_for_that_call_only(llm, blend_store):
    with pytest.raises(NoChunkFoundError):
        llm.invoke("Tell me about the quick brown fox.", strict=True)
    assert isinstance(llm.invoke("Tell me about the quick brown fox."), str)


def test_a_model_name_where_the_langchain_engine_goes_says_how_to_build_one():
    from blendrag.langchain import BlendLLM, ChatBlend

    for cls in (BlendLLM, ChatBlend):
        with pytest.raises(TypeError,
                           match=r"BlendEngine.from_pretrained\('smollm2-135m-instruct'\)"):
            cls(engine="smollm2-135m-instruct")


def test_a_copy_with_another_engine_runs_on_it(engine, llm, tiny_model):
    from blendrag import NO_CONTEXT, BlendEngine

    model, tokenizer = tiny_model
    other = BlendEngine(model, tokenizer, chat=True, chunk_prefix="", context=NO_CONTEXT)
    copy = llm.model_copy(update={"engine": other})
    assert copy.client.engine is other and llm.client.engine is engine
    copy.invoke("Hello.")
    assert copy.last_stats is not None and llm.last_stats is None


def test_from_documents_of_no_documents_says_what_is_wrong(llm, embedder, chroma_client,
                                                           collection_name):
    from blendrag.langchain import BlendChroma

    with pytest.raises(ValueError, match=r"^BlendChroma.from_documents / from_texts got no "
                                         r"documents: there is nothing to store or to "
                                         r"precompute\. Check that your loader"):
        BlendChroma.from_documents([], embedding=embedder, client=chroma_client,
                                   collection_name=collection_name, llm=llm)
    names = [c if isinstance(c, str) else c.name for c in chroma_client.list_collections()]
    assert collection_name not in names  # refused before Chroma made anything
