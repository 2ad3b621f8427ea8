"""Flat prompts (framework chains) become the same layout as the explicit pieces."""

from __future__ import annotations

from blendrag import BlendConfig
from blendrag.integration.flat_prompt import flat_layout
from blendrag.integration.text_index import ChunkTextIndex
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def test_documents_and_index_give_the_explicit_layout(engine_for):
    engine = engine_for("llama")
    explicit = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    prompt = PREFIX + "".join(PASSAGES) + SUFFIX
    index = ChunkTextIndex()
    by_docs = flat_layout(engine.prompts, prompt, index, texts=PASSAGES)
    by_index = flat_layout(engine.prompts, prompt, index)  # the documents were recorded
    assert by_docs.layout == explicit and by_index.layout == explicit
    assert (by_docs.source, by_index.source, by_index.matched) == ("documents", "index", 4)


def test_gaps_become_chunks_and_a_trailing_chunk_becomes_the_suffix(engine_for):
    engine = engine_for("llama")
    index = ChunkTextIndex()
    index.record(PASSAGES[:2])
    flat = flat_layout(engine.prompts, PREFIX + PASSAGES[0] + "\n---\n" + PASSAGES[1], index)
    # counts of the layout: the last text is the suffix
    assert flat.chunks == 2 and flat.matched == 1
    enc = engine.prompts.encode
    assert flat.layout.chunk_ids == (tuple(enc(PASSAGES[0])), tuple(enc("\n---\n")))
    assert flat.layout.suffix_ids == tuple(enc(PASSAGES[1]))


def test_no_known_chunk_is_a_plain_full_prefill(engine_for):
    engine = engine_for("llama")
    prompt = "Nothing here was ingested. " + SUFFIX
    flat = flat_layout(engine.prompts, prompt, ChunkTextIndex())
    assert flat.full_only and flat.layout.ids == engine.prompts.encode(prompt, first=True)


def test_rendered_chat_prompt_is_not_wrapped_twice(engine_for):
    engine = engine_for("llama", chat=True)
    explicit = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    rendered = engine.prompts.render(PREFIX, PASSAGES, SUFFIX)
    flat = flat_layout(engine.prompts, rendered, ChunkTextIndex(), texts=PASSAGES, templated=True)
    assert flat.layout == explicit
    full = engine.prefill(flat.layout, BlendConfig(mode="full")).logits
    blend = engine.prefill(flat.layout, BlendConfig(ratio=1.0)).logits
    assert (full - blend).abs().max() < 1e-4


def _plain_ids(builder, prompt: str, templated: bool = False) -> list[int]:
    """The ids a plain LLM runs for ``prompt``: the whole string through the tokenizer (the
    chat template's text around it unless ``templated``)."""
    head, tail = ("", "") if templated else builder.template_parts
    specials = not templated and not builder.chat
    return list(builder.tokenizer(head + prompt + tail, add_special_tokens=specials)["input_ids"])


def _stock_prompts(docs: list[str]) -> list[str]:
    """What stock chains write: a stuff chain's passages joined by blank lines after a prefix
    that ends in a space, a newline or a blank line; a passage twice; CRLF."""
    joined = "\n\n".join(docs)
    return [f"Context: {joined}\n\nQuestion: who?\nAnswer:",
            f"Use the passages.\n{joined}\nQ: who?",
            f"Context information is below.\n---------------------\n{joined}\n-----\nQuery: x",
            f"Context: {docs[0]}\n\n{docs[1]}\n\n{docs[0]}\n\nQ: who? A:",
            f"Context:\r\n{docs[0]}\r\n\r\n{docs[1]}\r\nQ: who?"]


def test_the_layout_runs_the_ids_a_plain_llm_runs_for_the_prompt(engine_for):
    """A flat prompt's layout, joined, is the prompt tokenized as one string: the pieces are
    cut from it (a token that spans a cut goes to the piece before), so a full prefill of the
    layout is one of the prompt as sent (each piece tokenized on its own differed at every
    blank line and after "Context: " with a BPE tokenizer)."""
    engine = engine_for("qwen2")  # a byte-level BPE with a chat template
    docs = [p.strip() for p in PASSAGES[:2]]
    for prompt in _stock_prompts(docs):
        flat = flat_layout(engine.prompts, prompt, ChunkTextIndex(), texts=docs)
        assert flat.matched >= 2, prompt
        assert flat.layout.ids == _plain_ids(engine.prompts, prompt), prompt


def test_a_templated_prompt_gets_no_second_bos(engine_for):
    """A prompt that spells the chat template (ChatBlend's) on an engine built with
    ``chat=False``: the template's own BOS only, as HF's apply_chat_template gives it."""
    from blendrag import BlendEngine

    base = engine_for("llama")
    engine = BlendEngine(base.model, base.tokenizer, chat=False, chunk_prefix="")
    tok = engine.tokenizer
    if not getattr(tok, "chat_template", None):
        import pytest
        pytest.skip("the tiny Llama tokenizer has no chat template")
    docs = [p.strip() for p in PASSAGES[:2]]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Context: " + "\n\n".join(docs) + "\nQ: who?"}],
        tokenize=False, add_generation_prompt=True)
    want = tok.apply_chat_template(
        [{"role": "user", "content": "Context: " + "\n\n".join(docs) + "\nQ: who?"}],
        tokenize=True, add_generation_prompt=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    for texts in (docs, None):
        index = ChunkTextIndex()
        index.record(docs)
        flat = flat_layout(engine.prompts, rendered, index, texts=texts, templated=True)
        assert flat.layout.ids == want
    assert engine.prompts.whole(rendered, templated=True).ids == want
