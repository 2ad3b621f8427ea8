"""BlendLLM and ChatBlend on their own: prompt splitting, configs, streaming, callbacks, async."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest

pytest.importorskip("langchain_core")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from helpers.lc_data import PASSAGES, QUESTION, TEMPLATE  # noqa: E402

DOCS = [Document(page_content=p) for p in PASSAGES[:3]]
PROMPT = TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input=QUESTION)


class TokenCollector(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)


def _messages(question: str = QUESTION) -> list:
    return [SystemMessage("Answer from the passages below.\n" + "\n\n".join(PASSAGES[:3])),
            HumanMessage(question)]


# ---- BlendLLM ----------------------------------------------------------------------------------


def test_documents_split_the_prompt(llm, engine):
    llm.invoke(PROMPT, documents=DOCS)
    bp = llm.last_prompt
    assert (bp.source, bp.matched, bp.chunks) == ("documents", 3, 5)
    prefix, suffix = "Answer from the passages below.\n", f"\nQuestion: {QUESTION}\nAnswer:"
    assert bp.layout == engine.build_prompt(prefix,
                                            [PASSAGES[0], "\n\n", PASSAGES[1], "\n\n", PASSAGES[2]],
                                            suffix)
    # The documents' texts are now known to the index: the flat prompt splits the same way.
    llm.invoke(PROMPT)
    assert llm.last_prompt.source == "index" and llm.last_prompt.layout == bp.layout


def test_generation_info_carries_stats(llm):
    result = llm.generate([PROMPT], documents=DOCS)
    info = result.generations[0][0].generation_info
    assert info["finish_reason"] in {"eos", "stop", "length"}
    stats = info["blendrag"]
    assert stats == llm.last_stats.to_dict()
    assert (
        stats["mode"] == "blend"
        and stats["chunks"] == 5
        and stats["chunk_misses"] + stats["chunk_hits"] == 5
    )
    prompt_info = info["blendrag_prompt"]
    assert info["blended"] is True and prompt_info.pop("match_s") > 0
    # nothing was ingested: the 3 passages were computed now, none read from the store
    assert prompt_info == {"source": "documents", "matched_chunks": 3, "chunks": 5,
                           "passage_hits": 0, "passage_head": 0, "fallback": None}
    assert 0 < stats["match_s"] < stats["ttft_s"]  # the layout counts in TTFT
    assert result.llm_output["model_name"] == llm.engine.name


def test_batch_gives_one_answer_per_prompt(llm):
    other = TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input="Who created Python?")
    answers = llm.batch([PROMPT, other], documents=DOCS)
    assert answers == [llm.invoke(PROMPT, documents=DOCS), llm.invoke(other, documents=DOCS)]
    assert llm.last_stats.cache.chunk_misses == 0  # all cached by the batch


def test_call_overrides_and_bind(llm):
    llm.bind(ratio=0.5, max_tokens=3).invoke(PROMPT, documents=DOCS)
    assert llm.last_stats.ratio == 0.5 and llm.last_stats.decode.new_tokens <= 3
    llm.invoke(PROMPT, documents=DOCS, mode="reuse")
    stats = llm.last_stats
    assert stats.mode == "reuse" and stats.compute.recomputed_chunk_tokens_per_layer == [0, 0, 0]


def test_stop_strings(llm):
    text = llm.invoke(PROMPT, documents=DOCS)
    stop = next(text[i:i + 2] for i in range(1, len(text) - 1) if "\ufffd" not in text[:i + 2])
    cut = llm.invoke(PROMPT, documents=DOCS, stop=[stop])
    assert cut == text[:text.index(stop)]
    assert llm.last_stats.decode.finish_reason == "stop"
    assert llm.model_copy(update={"stop": [stop]}).invoke(PROMPT, documents=DOCS) == cut


def test_stream_reports_every_chunk_to_callbacks(llm):
    handler = TokenCollector()
    parts = list(llm.stream(PROMPT, config={"callbacks": [handler]}, documents=DOCS))
    assert len([p for p in parts if p]) > 1
    # every text chunk is reported, the final (metadata) chunk is not: no extra empty event
    # (a chunk holds more than one token only where a token ends inside a UTF-8 character)
    assert parts[-1] == "" and handler.tokens == parts[:-1] and "" not in handler.tokens
    assert 0 < len(handler.tokens) <= llm.last_stats.decode.new_tokens
    assert "".join(parts) == llm.invoke(PROMPT, documents=DOCS)


def test_invoke_reports_tokens_only_when_streaming(llm):
    quiet, loud = TokenCollector(), TokenCollector()
    text = llm.invoke(PROMPT, config={"callbacks": [quiet]}, documents=DOCS)
    assert quiet.tokens == []
    streaming = llm.model_copy(update={"streaming": True})
    assert streaming.invoke(PROMPT, config={"callbacks": [loud]}, documents=DOCS) == text
    assert "".join(loud.tokens) == text and len(loud.tokens) > 1


def test_async_equals_sync(llm):
    text = llm.invoke(PROMPT, documents=DOCS)

    async def run():
        parts = [p async for p in llm.astream(PROMPT, documents=DOCS)]
        return (
            await llm.ainvoke(PROMPT, documents=DOCS),
            "".join(parts),
            await llm.abatch([PROMPT], documents=DOCS),
        )

    assert asyncio.run(run()) == (text, text, [text])


def test_prompt_ending_with_a_chunk_without_chat_template(tiny_model):
    """Without a chat template nothing follows the last chunk: it is computed as the suffix."""
    from blendrag import BlendEngine
    from blendrag.langchain import BlendLLM

    llm = BlendLLM(engine=BlendEngine(*tiny_model, chat=False, chunk_prefix=""), max_tokens=4)
    prompt = "Passages:\n" + PASSAGES[0] + PASSAGES[1]
    llm.invoke(prompt, documents=[Document(page_content=p) for p in PASSAGES[:2]])
    assert llm.last_prompt.chunks == 1 and llm.last_prompt.matched == 1
    assert llm.last_prompt.layout.suffix_ids == tuple(llm.engine.prompts.encode(PASSAGES[1]))


def test_documents_not_in_the_prompt_are_skipped(llm):
    llm.invoke(PROMPT, documents=DOCS + [Document(page_content=PASSAGES[5])])
    assert llm.last_prompt.matched == 3


def test_misuse_is_reported(llm, engine, caplog):
    from blendrag.langchain import BlendLLM

    with pytest.raises(TypeError, match="Document"):
        llm.invoke(PROMPT, documents=PASSAGES[:3])
    with caplog.at_level(logging.WARNING):
        llm.invoke(PROMPT, documnets=DOCS)
    assert "documnets" in caplog.text
    with pytest.raises(ValidationError, match="mode"):
        BlendLLM(engine=engine, mode="fastest")
    with pytest.raises(ValidationError, match="ratio"):
        BlendLLM(engine=engine, ratio=1.5)


def test_identity_and_tracing_params(llm):
    assert llm._llm_type == "blendrag"
    params = llm._identifying_params
    assert (
        params["model"] == llm.engine.name and params["ratio"] == 0.3 and params["max_tokens"] == 8
    )
    ls = llm._get_ls_params(stop=["\n"])
    assert (
        ls["ls_provider"] == "blendrag" and ls["ls_model_type"] == "llm" and ls["ls_stop"] == ["\n"]
    )
    assert ls["ls_max_tokens"] == 8 and ls["ls_temperature"] == 0.0


# ---- ChatBlend ---------------------------------------------------------------------------------


@pytest.fixture
def chat(engine, llm):
    from blendrag.langchain import ChatBlend

    return ChatBlend(engine=engine, ratio=0.3, max_tokens=8, text_index=llm.text_index)


def test_chat_documents_and_index_paths_agree(chat):
    answer = chat.invoke(_messages(), documents=DOCS)
    bp = chat.last_prompt
    assert (bp.source, bp.matched, bp.chunks) == ("documents", 3, 5)
    # one separator reused
    assert chat.last_stats.cache.chunk_misses == 4 and chat.last_stats.cache.chunk_hits == 1
    again = chat.invoke(_messages())
    assert chat.last_prompt.source == "index" and chat.last_prompt.layout == bp.layout
    assert chat.last_stats.cache.chunk_hits == 5 and chat.last_stats.cache.chunk_misses == 0
    assert again.content == answer.content


def test_chat_layout_is_the_rendered_conversation(chat, engine):
    chat.invoke(_messages(), documents=DOCS)
    layout = chat.last_prompt.layout
    rendered = chat.render(_messages())
    assert rendered.startswith("<s><|system|>\nAnswer from the passages below.\n")
    assert rendered.endswith(f"<|user|>\n{QUESTION}<|end|>\n<|assistant|>\n")
    assert engine.tokenizer.decode(layout.ids) == rendered
    assert layout.chunk_ids[0] == tuple(engine.prompts.encode(PASSAGES[0]))
    assert layout.chunk_prefix_ids == tuple(engine.prompts.chunk_prefix_ids())


def test_chat_usage_and_metadata(chat):
    message = chat.invoke(_messages(), documents=DOCS)
    stats = chat.last_stats
    assert message.usage_metadata == {"input_tokens": stats.prompt.tokens,
                                      "output_tokens": stats.decode.new_tokens,
                                      "total_tokens": stats.prompt.tokens + stats.decode.new_tokens}
    meta = message.response_metadata
    assert meta["blendrag"] == stats.to_dict() and meta["model_provider"] == "blendrag"
    assert meta["finish_reason"] == stats.decode.finish_reason


def test_chat_stream_equals_invoke_and_callbacks(chat):
    answer = chat.invoke(_messages(), documents=DOCS).content
    handler = TokenCollector()
    parts = [c.content for c in chat.stream(_messages(), config={"callbacks": [handler]},
                                            documents=DOCS)]
    assert "".join(parts) == answer and len([p for p in parts if p]) > 1
    # no extra empty event for the final chunk (it carries the last text and the metadata)
    assert handler.tokens == parts and "" not in parts
    assert 0 < len(parts) <= chat.last_stats.decode.new_tokens

    async def run():
        streamed = [c.content async for c in chat.astream(_messages(), documents=DOCS)]
        return (await chat.ainvoke(_messages(), documents=DOCS)).content, "".join(streamed)

    assert asyncio.run(run()) == (answer, answer)


def test_chat_multi_turn_and_engine_system(tiny_model):
    from blendrag import BlendEngine
    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=BlendEngine(*tiny_model, chat=True, system="Be brief.",
                                        chunk_prefix=""), max_tokens=4)
    turns = [HumanMessage("Hello there, friend."), AIMessage("Hi."), HumanMessage(QUESTION)]
    assert chat.render(turns).startswith("<s><|system|>\nBe brief.<|end|>\n<|user|>\nHello there")
    assert "<|assistant|>\nHi.<|end|>\n" in chat.render(turns)
    assert "Be brief." not in chat.render([SystemMessage("Other rules."), *turns])
    assert isinstance(chat.invoke(turns).content, str)
    assert chat.last_prompt.source == "none" and chat.last_stats.mode == "full"


def test_chat_needs_a_chat_template(tiny_model):
    from blendrag import BlendEngine
    from blendrag.langchain import ChatBlend

    model, tokenizer = tiny_model
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(ValidationError, match="chat_template"):
        ChatBlend(engine=BlendEngine(model, plain, chat=False))


def test_documents_formatted_differently_fall_back_to_the_index(llm):
    llm.text_index.record(PASSAGES[:3])
    llm.invoke(PROMPT, documents=[Document(page_content="[1] " + p) for p in PASSAGES[:3]])
    assert llm.last_prompt.source == "index" and llm.last_prompt.matched == 3


def test_async_requests_leave_the_event_loop_free_and_run_concurrently(llm):
    """ainvoke/astream run the model in worker threads: the loop keeps ticking meanwhile, and
    concurrent requests on one engine give the answers they give one at a time."""
    prompts = [PROMPT, TEMPLATE.format(context="\n\n".join(PASSAGES[:3]), input="Who made it?")]
    expected = [llm.invoke(p, documents=DOCS) for p in prompts]

    async def run():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        tick = asyncio.create_task(ticker())
        answers = await asyncio.gather(*(llm.ainvoke(p, documents=DOCS) for p in prompts * 2))
        done.set()
        await tick
        return answers, ticks

    answers, ticks = asyncio.run(run())
    assert answers == expected * 2 and ticks > 5


def test_tokens_are_counted_with_the_engines_tokenizer(llm, engine, monkeypatch):
    """LangChain counts tokens (map_reduce, trim_messages, token-buffer memories) with
    ``get_token_ids``, whose default loads GPT-2's tokenizer from the hub: offline, minutes of
    retries and a count of 0. The engine's own tokenizer counts them, the chat's as rendered."""
    import langchain_core.language_models.base as lc_base

    from blendrag.langchain import ChatBlend

    def no_hub(*_a, **_kw):
        raise AssertionError("GPT-2's tokenizer was asked for")

    monkeypatch.setattr(lc_base, "get_tokenizer", no_hub)
    text = PASSAGES[0]
    assert llm.get_token_ids(text) == engine.prompts.encode(text)
    assert llm.get_num_tokens(text) == len(engine.prompts.encode(text))
    chat = ChatBlend(engine=engine)
    messages = [SystemMessage("Answer briefly."), HumanMessage(QUESTION)]
    assert chat.get_num_tokens_from_messages(messages) == len(
        engine.prompts.encode(chat.render(messages)))


def test_llms_over_one_engine_share_its_text_index(llm, engine):
    """Chunks ingested through one LLM (the vector store's) are found in the flat prompts of
    another over the same engine (the chain's ChatBlend, a second BlendLLM): one in-memory
    index per engine and namespace, as a persisted one is per store folder."""
    from blendrag.langchain import BlendLLM, ChatBlend

    llm.client.ingest(PASSAGES[:3])
    other = BlendLLM(engine=engine, max_tokens=2)
    other.invoke(PROMPT)
    assert other.last_prompt.source == "index" and other.last_prompt.matched == 3
    assert other.fallbacks == 0
    chat = ChatBlend(engine=engine, max_tokens=2)
    assert chat.text_index is llm.text_index
    tenant = BlendLLM(engine=engine, namespace="acme")  # another namespace: its own
    assert tenant.text_index is not llm.text_index


def test_prefix_mode_is_not_reported_as_blended_nor_warned_about(llm, caplog):
    """Prefix mode takes the prompt's own prefix and first chunk, never the ingested chunks:
    not 'blended', and no warning to ingest what it would not use."""
    llm.client.ingest(PASSAGES[:3])
    with caplog.at_level(logging.WARNING, logger="blendrag"):
        info = llm.generate([PROMPT], mode="prefix").generations[0][0].generation_info
    assert info["blended"] is False and info["blendrag"]["mode"] == "prefix"
    assert not any("had a stored KV" in r.getMessage() for r in caplog.records)
    info = llm.generate([PROMPT], mode="reuse").generations[0][0].generation_info
    assert info["blended"] is True
