"""LangChain's batch and async paths are served by the engine's scheduler (blendrag.serving):
several requests share its batched decoding steps, and each answer equals the one ``invoke``
gives alone, for ``BlendLLM`` and ``ChatBlend``."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402

from blendrag.serving import ServingConfig, scheduler_for  # noqa: E402
from helpers.lc_data import PASSAGES, TEMPLATE  # noqa: E402

QUESTIONS = ("Where was Lionel Messi born?", "Who moved to Paris?", "What is reused?",
             "Which city is named first?")
DOCS = [Document(page_content=p) for p in PASSAGES[:3]]


def _prompt(question: str) -> str:
    return TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input=question)


def _messages(question: str) -> list:
    return [SystemMessage("Answer from the passages below.\n" + "\n\n".join(PASSAGES[:3])),
            HumanMessage(question)]


def _served(engine):
    # prefills in the decoding loop: requests that arrive together then share every step (a
    # prefill worker lets the tiny model's first request finish before the next is prefilled)
    stats = scheduler_for(engine, ServingConfig(prefill_workers=0)).stats
    return stats.requests, stats.decoded, stats.steps


def test_batch_is_served_together_and_equals_invoke(llm, engine):
    alone = [llm.invoke(_prompt(q), documents=DOCS) for q in QUESTIONS]
    before = _served(engine)
    together = llm.batch([_prompt(q) for q in QUESTIONS], documents=DOCS)
    after = _served(engine)
    assert together == alone
    assert after[0] - before[0] == len(QUESTIONS)
    assert (after[1] - before[1]) > (after[2] - before[2])  # steps held several requests


def test_abatch_ainvoke_astream_are_served_and_equal_invoke(llm, engine):
    alone = [llm.invoke(_prompt(q), documents=DOCS) for q in QUESTIONS]
    before = _served(engine)

    async def run():
        streamed = ["".join([c async for c in llm.astream(_prompt(QUESTIONS[0]),
                                                          documents=DOCS)])]
        invoked = await asyncio.gather(*(llm.ainvoke(_prompt(q), documents=DOCS)
                                         for q in QUESTIONS))
        batched = await llm.abatch([_prompt(q) for q in QUESTIONS], documents=DOCS)
        return streamed, list(invoked), batched

    streamed, invoked, batched = asyncio.run(run())
    assert streamed == alone[:1] and invoked == alone and batched == alone
    assert _served(engine)[0] - before[0] == 1 + 2 * len(QUESTIONS)
    assert llm.last_stats is not None and llm.last_stats.decode.new_tokens > 0


def test_chat_batch_and_async_are_served_and_equal_invoke(engine):
    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=engine, ratio=0.3, max_tokens=8)
    alone = [chat.invoke(_messages(q), documents=DOCS).content for q in QUESTIONS]
    before = _served(engine)
    together = [m.content for m in chat.batch([_messages(q) for q in QUESTIONS],
                                              documents=DOCS)]

    async def run():
        return [m.content for m in await asyncio.gather(
            *(chat.ainvoke(_messages(q), documents=DOCS) for q in QUESTIONS))]

    assert together == alone
    assert asyncio.run(run()) == alone
    after = _served(engine)
    assert after[0] - before[0] == 2 * len(QUESTIONS)
    assert (after[1] - before[1]) > (after[2] - before[2])


def test_a_batch_input_that_fails_fails_alone(llm, engine):
    """Each input of ``batch``/``abatch`` is its own request: one too long for the model's
    context gets its error, every other input its answer (BaseLLM's one ``generate`` for all
    gave every input the error)."""
    alone = [llm.invoke(_prompt(q), documents=DOCS) for q in QUESTIONS[:2]]
    too_long = _prompt(QUESTIONS[0]) + " word" * 2000
    inputs = [_prompt(QUESTIONS[0]), too_long, _prompt(QUESTIONS[1])]
    got = llm.batch(inputs, documents=DOCS, return_exceptions=True)
    assert [got[0], got[2]] == alone and isinstance(got[1], ValueError)
    got = asyncio.run(llm.abatch(inputs, documents=DOCS, return_exceptions=True))
    assert [got[0], got[2]] == alone and isinstance(got[1], ValueError)


def test_cancelling_an_abatch_cancels_every_request_in_it(llm, engine):
    scheduler = scheduler_for(engine, ServingConfig(prefill_workers=0))
    before = scheduler.stats.cancelled

    async def leave_early():
        task = asyncio.create_task(llm.abatch([_prompt(q) for q in QUESTIONS], documents=DOCS,
                                              max_tokens=400, stop=[]))
        while scheduler.stats.decoded == 0 or scheduler.running < len(QUESTIONS):
            await asyncio.sleep(0.01)  # every request decoding
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave_early())
    deadline = 100
    while (scheduler.running or scheduler.waiting) and deadline:
        asyncio.run(asyncio.sleep(0.05))
        deadline -= 1
    assert scheduler.stats.cancelled - before == len(QUESTIONS)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks


def test_a_batch_larger_than_the_queue_waits_for_it(llm, engine):
    """More inputs than the scheduler queues: every input gets its answer (at most
    ``max_queue`` of them wait at once), none a ``QueueFull``, for ``batch`` and ``abatch``."""
    scheduler = scheduler_for(engine, ServingConfig(prefill_workers=0, max_queue=1, max_seqs=1))
    prompts = [_prompt(q) for q in QUESTIONS]
    alone = [llm.invoke(p, documents=DOCS) for p in prompts]
    assert llm.batch(prompts, documents=DOCS) == alone
    assert asyncio.run(llm.abatch(prompts, documents=DOCS)) == alone
    assert llm.batch(prompts, {"max_concurrency": 8}, documents=DOCS) == alone
    assert scheduler.stats.requests == 3 * len(QUESTIONS)
