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


def test_a_stream_dropped_before_it_is_read_cancels_its_request(make_llm):
    """``astream_complete`` and ``astream_chat`` queue the request when awaited (a bad one
    raises there): if the caller drops the responses unread, the request is cancelled and
    frees its slot and blocks rather than decode to its last token."""
    import gc

    llm = make_llm(chat=True)
    scheduler = scheduler_for(llm.engine, ServingConfig(prefill_workers=0))
    before = scheduler.stats.cancelled
    prompt = f"{PREFIX}{PASSAGES[0]}Question: {QUESTIONS[0]}\nAnswer:"

    async def drop():
        stream = await llm.astream_complete(prompt, max_tokens=400)
        chat = await llm.astream_chat([ChatMessage(role="user", content=prompt)],
                                      max_tokens=400)
        del stream, chat
        gc.collect()

    asyncio.run(drop())
    assert scheduler.stats.requests >= 2
    for _ in range(200):
        if not (scheduler.running or scheduler.waiting):
            break
        asyncio.run(asyncio.sleep(0.05))
    assert scheduler.stats.cancelled - before == 2
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
