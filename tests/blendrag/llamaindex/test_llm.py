"""BlendLLM on its own: prompt splitting, modes, chat, streaming, async, callbacks, errors."""

from __future__ import annotations

import asyncio
import importlib
import sys

import pytest
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.llms import ChatMessage
from llama_index.core.schema import NodeWithScore, TextNode

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.caches.profile import profiled
from blendrag.llamaindex import BlendKVTransform, BlendLLM
from helpers.li_data import GENERATION, ingest
from helpers.tiny import PASSAGES

PREFIX, SUFFIX = "Answer from the passages.\n", "Question: who was born first?\nAnswer:"


def prompt_and_nodes(llm: BlendLLM) -> tuple[str, list[NodeWithScore]]:
    nodes = [NodeWithScore(node=TextNode(text=p.strip()), score=1.0) for p in PASSAGES[:3]]
    return PREFIX + "".join(llm.chunk_text(n) for n in nodes) + SUFFIX, nodes


def test_nodes_split_keeps_gaps_and_tolerates_order_and_missing_nodes(make_llm):
    llm = make_llm()
    prompt, nodes = prompt_and_nodes(llm)
    a, b, c = (llm.chunk_text(n) for n in nodes)
    gappy = PREFIX + a + "--- a gap ---\n" + b + c + SUFFIX
    llm.complete(gappy, nodes=nodes)
    stats = llm.last_stats
    assert (stats.prompt.chunks, stats.cache.chunk_misses) == (4, 4)  # 3 nodes + the gap
    llm.complete(prompt,
                 nodes=[nodes[2], nodes[0], NodeWithScore(node=TextNode(text="not in the prompt"))])
    stats = llm.last_stats
    assert (stats.prompt.chunks, stats.cache.chunk_hits) == (3, 3)  # found in prompt order


def test_nodes_blend_ratio_one_equals_full_and_stats_are_returned(make_llm):
    llm = make_llm()
    prompt, nodes = prompt_and_nodes(llm)
    assert ingest(llm, nodes) == 3 and ingest(llm, nodes) == 0
    blend = llm.complete(prompt, nodes=nodes, blend_config=BlendConfig(ratio=1.0))
    assert (llm.last_stats.cache.chunk_hits, llm.last_stats.cache.chunk_misses) == (3, 0)
    assert blend.additional_kwargs["stats"] == blend.raw["stats"] == llm.last_stats.to_dict()
    full = llm.complete(prompt, nodes=nodes, blend_config=BlendConfig(mode="full"))
    assert full.raw["token_ids"] == blend.raw["token_ids"] and len(full.raw["token_ids"]) == 8
    assert full.text == blend.text


def test_flat_prompt_uses_text_index_and_unknown_prompt_runs_full(make_llm):
    llm = make_llm()
    prompt, nodes = prompt_and_nodes(llm)
    ingest(llm, nodes)
    with_nodes = llm.complete(prompt, nodes=nodes).raw["token_ids"]
    assert llm.complete(prompt).raw["token_ids"] == with_nodes  # same split found in the flat text
    assert llm.last_stats.cache.chunk_hits == 3
    llm.complete("Nothing ingested appears in this prompt.")
    assert (llm.last_stats.mode, llm.last_stats.cache.chunk_hits) == ("full", 0)


def test_prompt_ending_with_a_chunk_computes_it_as_the_suffix(make_llm):
    llm = make_llm()
    _, nodes = prompt_and_nodes(llm)
    prompt = PREFIX + "".join(llm.chunk_text(n) for n in nodes)
    llm.complete(prompt, nodes=nodes)
    assert (llm.last_stats.prompt.chunks, llm.last_stats.cache.chunk_misses) == (2, 2)


def test_streaming_matches_complete_and_ends_with_stats(make_llm):
    llm = make_llm()
    prompt, nodes = prompt_and_nodes(llm)
    text = llm.complete(prompt, nodes=nodes).text
    responses = list(llm.stream_complete(prompt, nodes=nodes))
    assert "".join(r.delta for r in responses) == responses[-1].text == text
    assert responses[-1].additional_kwargs["stats"]["chunk_hits"] == 3


def test_chat_uses_the_template_and_matches_complete(make_llm):
    llm = make_llm(chat=True)
    prompt, nodes = prompt_and_nodes(llm)
    completed = llm.complete(prompt, nodes=nodes)
    chatted = llm.chat([ChatMessage(role="user", content=prompt)], nodes=nodes)
    assert chatted.message.content == completed.text
    assert chatted.raw["token_ids"] == completed.raw["token_ids"]
    streamed = list(llm.stream_chat([ChatMessage(role="user", content=prompt)], nodes=nodes))
    assert "".join(r.delta for r in streamed) == completed.text
    assert llm.last_stats.cache.chunk_hits == 3


def test_async_variants_match_sync(make_llm):
    llm = make_llm(chat=True)
    prompt, nodes = prompt_and_nodes(llm)
    text = llm.complete(prompt, nodes=nodes).text
    messages = [ChatMessage(role="user", content=prompt)]

    async def run() -> list[str]:
        streamed = await llm.astream_complete(prompt, nodes=nodes)
        chat_stream = await llm.astream_chat(messages, nodes=nodes)
        return [(await llm.acomplete(prompt, nodes=nodes)).text,
                "".join([r.delta async for r in streamed]),
                (await llm.achat(messages, nodes=nodes)).message.content,
                "".join([r.delta async for r in chat_stream])]

    assert asyncio.run(run()) == [text] * 4


def test_callbacks_see_llm_events(make_llm):
    debug = LlamaDebugHandler()
    llm = make_llm(callback_manager=CallbackManager([debug]))
    prompt, nodes = prompt_and_nodes(llm)
    llm.complete(prompt, nodes=nodes)
    list(llm.stream_complete(prompt, nodes=nodes))
    assert len(debug.get_event_pairs(CBEventType.LLM)) == 2


def test_metadata_describes_the_engine(make_llm):
    meta = make_llm().metadata
    assert (meta.context_window, meta.num_output, meta.is_chat_model) == (
        1024,
        GENERATION.max_new_tokens,
        False,
    )


def test_ingestion_needs_a_chunk_prefix(base_engine):
    llm = BlendLLM(BlendEngine(base_engine.model, base_engine.tokenizer, chat=False))
    with pytest.raises(ValueError, match="chunk_prefix"):
        BlendKVTransform(llm)
    with pytest.raises(ValueError, match="chunk_template"):
        BlendLLM(base_engine, chunk_template="no placeholder")


def test_missing_llama_index_names_the_extra(monkeypatch):
    for name in [
        m for m in sys.modules if m == "blendrag.llamaindex" or m.startswith("blendrag.llamaindex.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    # makes `import llama_index.core` fail
    monkeypatch.setitem(sys.modules, "llama_index.core", None)
    with pytest.raises(ImportError, match=r"pip install blendrag\[llamaindex\]"):
        importlib.import_module("blendrag.llamaindex")


def test_ingest_with_profile_measures_each_node_after_the_previous_non_empty_one(make_llm):
    import torch

    def entry(llm, node):
        engine = llm.engine
        return engine.store.get(engine.key(engine.prompts.chunk_prefix_ids(),
                                           engine.prompts.encode(llm.chunk_text(node))))

    def profile_after(llm, node, *before):
        engine = llm.engine
        probes = [engine.prompts.encode(llm.chunk_text(b)) for b in before]
        prefix = engine.prompts.chunk_prefix_ids()
        return profiled(engine.runner, entry(llm, node), prefix, probes).profile

    nodes = [TextNode(text=p.strip()) for p in PASSAGES[:3]]
    llm = make_llm()
    assert ingest(llm, nodes, profile=True) == 3 and ingest(llm, nodes, profile=True) == 0
    for i, node in enumerate(nodes):  # after the node before it (the first after the last)
        assert torch.equal(entry(llm, node).profile, profile_after(llm, node, nodes[i - 1]))
    bare = make_llm(chunk_template="{text}")  # an empty node is then empty text: no tokens, no KV
    assert ingest(bare, [nodes[0], TextNode(text=""), nodes[1]], profile=True) == 2
    assert torch.equal(entry(bare, nodes[1]).profile, profile_after(bare, nodes[1], nodes[0]))
    plain = make_llm()
    assert ingest(plain, nodes) == 3
    assert all(entry(plain, n).profile is None for n in nodes)
    two = make_llm()  # profile=2: after each of the two nodes before it, the largest deviation kept
    assert ingest(two, nodes, profile=2) == 3
    for i, node in enumerate(nodes):
        assert torch.equal(entry(two, node).profile,
                           profile_after(two, node, nodes[i - 1], nodes[i - 2]))
    with pytest.raises(ValueError, match="profile must be"):
        ingest(make_llm(), nodes, profile=-1)


def test_the_transform_refuses_a_langchain_llm_by_name(make_llm):
    pytest.importorskip("langchain_core")
    from blendrag.langchain import BlendLLM as LangChainLLM
    from blendrag.llamaindex import BlendKVTransform

    with pytest.raises(TypeError, match="LlamaIndex BlendLLM"):
        BlendKVTransform(LangChainLLM(engine=make_llm().engine))
