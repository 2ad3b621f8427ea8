"""LlamaIndex's ContextChatEngine over BlendLLM with the engine's prefix cache: unchanged chat
engine code, and from turn 2 the request starts from the rows of the turns before (the system
prompt, the retrieved passages, the history); with ``mode="full"`` the answers are those of an
engine without the cache."""

from __future__ import annotations

import pytest
from llama_index.core import Settings
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.chat_engine import CondensePlusContextChatEngine, ContextChatEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from blendrag import NO_CONTEXT, BlendEngine
from blendrag.llamaindex import BlendLLM
from helpers.li_data import GENERATION, ingest
from helpers.tiny import PASSAGES

QUESTIONS = ["Where was Messi born?", "And where did he move?", "Who was born first?"]
MIB = 1 << 20


class SamePassages(BaseRetriever):
    """The passages a conversation is about, the same at every turn (what a retriever returns
    for follow-up questions on one topic)."""

    def __init__(self, nodes: list[TextNode]) -> None:
        super().__init__()
        self.nodes = nodes

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=n, score=1.0) for n in self.nodes]


def _llm(base_engine: BlendEngine, prefix_cache_bytes: int, history_bytes: int | None = None,
         **kw) -> BlendLLM:
    engine = BlendEngine(base_engine.model, base_engine.tokenizer, chat=False, chunk_prefix="",
                         context=NO_CONTEXT, prefix_cache_bytes=prefix_cache_bytes,
                         history_bytes=history_bytes)
    return BlendLLM(engine, generation_config=GENERATION, chunk_template="{text}\n\n",
                    chunk_separator="", **kw)


def _conversation(llm: BlendLLM, nodes: list[TextNode],
                  monkeypatch) -> tuple[list[str], list[dict]]:
    """Three turns through a ContextChatEngine: (answers, each turn's request stats as the
    chat response's metadata gave them to LlamaIndex's callbacks)."""
    ingest(llm, nodes)
    debug = LlamaDebugHandler()
    # the chat engine hands the global callback manager to its LLM
    monkeypatch.setattr(Settings, "callback_manager", CallbackManager([debug]))
    chat = ContextChatEngine.from_defaults(retriever=SamePassages(nodes), llm=llm,
                                           context_template="Passages:\n{context_str}\n")
    answers = [chat.chat(question).response for question in QUESTIONS]
    ends = [end for _, end in debug.get_event_pairs(CBEventType.LLM)]
    # a completion model's events carry the completion, a chat model's the chat response
    responses = [e.payload.get(EventPayload.COMPLETION) or e.payload[EventPayload.RESPONSE]
                 for e in ends]
    stats = [r.additional_kwargs["stats"] for r in responses]
    assert len(stats) == len(QUESTIONS) and stats[-1] == llm.last_stats.to_dict()
    return answers, stats


def test_a_context_chat_engine_starts_each_turn_from_the_turns_before(base_engine, monkeypatch):
    nodes = [TextNode(text=p.strip(), id_=f"c{i}") for i, p in enumerate(PASSAGES[:4])]
    llm = _llm(base_engine, 64 * MIB)
    _, stats = _conversation(llm, nodes, monkeypatch)
    assert stats[0]["prefix_cache_tokens"] == 0
    for turn in stats[1:]:
        # the system prompt and every passage came from the turn before
        assert turn["prefix_cache_tokens"] >= turn["prefix_tokens"] + turn["chunk_tokens"] - 32
        assert turn["prefix_cache_exact"] is False  # turn 1 was blended
        assert turn["computed_per_layer"][0] < turn["prompt_tokens"] / 2


def test_full_mode_chat_answers_equal_those_without_the_cache(base_engine, monkeypatch):
    nodes = [TextNode(text=p.strip(), id_=f"f{i}") for i, p in enumerate(PASSAGES[:4])]
    cached = _llm(base_engine, 64 * MIB, mode="full")
    cached_answers, stats = _conversation(cached, nodes, monkeypatch)
    plain_answers, plain = _conversation(_llm(base_engine, 0, mode="full"), nodes, monkeypatch)
    assert cached_answers == plain_answers
    assert all(s["prefix_cache_exact"] is True for s in stats[1:])
    assert all(s["prefix_cache_tokens"] > 0 for s in stats[1:])
    assert all(s["prefix_cache_tokens"] == 0 for s in plain)


class NewPassages(BaseRetriever):
    """Two passages per call, other ones at every turn (a retriever that follows the topic of
    each follow-up question)."""

    def __init__(self, nodes: list[TextNode]) -> None:
        super().__init__()
        self.nodes, self.calls = nodes, 0

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        k = self.calls % (len(self.nodes) // 2)
        self.calls += 1
        return [NodeWithScore(node=n, score=1.0) for n in self.nodes[2 * k:2 * k + 2]]


def _chat_turns(llm: BlendLLM, chat) -> list[dict]:
    """Each turn's stats of the last request (the answer's), after the conversation."""
    stats = []
    for question in QUESTIONS:
        chat.chat(question)
        stats.append(llm.last_stats.to_dict())
    return stats


@pytest.mark.parametrize("engine_kind", ["context", "condense_plus_context"])
def test_a_chat_engine_whose_passages_change_reuses_the_history_rows(base_engine, engine_kind):
    nodes = [TextNode(text=f"{p.strip()} Note {i}.", id_=f"n{engine_kind}{i}")
             for i, p in enumerate([*PASSAGES, *PASSAGES][:6])]  # 3 turns, 3 sets
    runs = {}
    for name, history_bytes in (("history", None), ("without", 0)):
        llm = _llm(base_engine, 64 * MIB, history_bytes)
        ingest(llm, nodes)
        retriever = NewPassages(nodes)
        chat = (ContextChatEngine.from_defaults(retriever=retriever, llm=llm,
                                                context_template="Passages:\n{context_str}\n")
                if engine_kind == "context" else
                CondensePlusContextChatEngine.from_defaults(retriever=retriever, llm=llm))
        runs[name] = _chat_turns(llm, chat)
    history, without = runs["history"], runs["without"]
    assert history[0]["history_tokens"] == 0
    for turn, plain in zip(history[1:], without[1:]):
        assert turn["history_tokens"] >= 16 and plain["history_tokens"] == 0
        # the passages changed: the prefix cache ends before the first one
        assert turn["prefix_cache_tokens"] < turn["prefix_tokens"] + turn["chunk_tokens"] / 2
        assert turn["computed_per_layer"][-1] < plain["computed_per_layer"][-1]
