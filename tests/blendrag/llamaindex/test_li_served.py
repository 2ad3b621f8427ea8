"""LlamaIndex's async paths are served by the engine's scheduler (blendrag.serving): requests
awaited together share its batched decoding steps, each with the answer ``complete`` gives
alone."""

from __future__ import annotations

import asyncio

from llama_index.core.llms import ChatMessage
from llama_index.core.schema import NodeWithScore, TextNode

from blendrag.serving import ServingConfig, scheduler_for
from helpers.li_data import ingest
from helpers.tiny import PASSAGES

PREFIX = "Answer from the passages.\n"
QUESTIONS = ("who was born first?", "who moved to Paris?", "what is reused?",
             "which city is named first?")


def test_async_requests_are_served_together_and_equal_sync(make_llm):
    llm = make_llm(chat=True)
    nodes = [NodeWithScore(node=TextNode(text=p.strip()), score=1.0) for p in PASSAGES[:3]]
    ingest(llm, nodes)
    context = "".join(llm.chunk_text(n) for n in nodes)
    prompts = [f"{PREFIX}{context}Question: {q}\nAnswer:" for q in QUESTIONS]
    alone = [llm.complete(p, nodes=nodes).text for p in prompts]
    stats = scheduler_for(llm.engine, ServingConfig(prefill_workers=0)).stats  # see test_lc_served
    before = (stats.requests, stats.decoded, stats.steps)

    async def run():
        completed = await asyncio.gather(*(llm.acomplete(p, nodes=nodes) for p in prompts))
        chats = await asyncio.gather(*(llm.achat([ChatMessage(role="user", content=p)],
                                                 nodes=nodes) for p in prompts))
        streams = [await llm.astream_complete(p, nodes=nodes) for p in prompts]
        streamed = await asyncio.gather(*(_join(s) for s in streams))
        return ([r.text for r in completed], [r.message.content for r in chats],
                list(streamed))

    completed, chats, streamed = asyncio.run(run())
    assert completed == alone and chats == alone and streamed == alone
    assert stats.requests - before[0] == 3 * len(prompts)
    assert (stats.decoded - before[1]) > (stats.steps - before[2])  # several per step
    assert llm.last_stats is not None and llm.last_stats.cache.chunk_hits == 3


async def _join(stream) -> str:
    return "".join([r.delta async for r in stream])
