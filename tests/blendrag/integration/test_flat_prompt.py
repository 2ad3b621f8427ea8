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
