"""The shipped demo model loads offline and answers held-out questions after a full prefill."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blendrag_demo import (
    HELDOUT_SEED,
    check_demo_model,
    demo_model_path,
    encode_prompt,
    exact_match,
    generate_examples,
)

N_QUESTIONS = 24

if not (demo_model_path() / "model.safetensors").is_file():
    pytest.skip(
        "demo model not shipped yet: run scripts/train_demo_model.py (writes "
        "src/blendrag/demo/model)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def model_and_tok():
    path = check_demo_model()
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model.eval()
    return model, tok


def test_model_dir_is_packaged() -> None:
    path = demo_model_path()
    assert path.is_dir() and path.name == "model"
    assert check_demo_model() == path
    assert (path / "model.safetensors").stat().st_size < 32 * 2**20
    assert not list(path.glob("*.bin")), "weights must be safetensors only"


def test_loads_as_llama_with_gqa(model_and_tok) -> None:
    model, tok = model_and_tok
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.vocab_size == len(tok)
    assert tok.chat_template
    assert model.generation_config.eos_token_id == tok.eos_token_id


@torch.no_grad()
def test_answers_heldout_questions(model_and_tok) -> None:
    model, tok = model_and_tok
    examples = generate_examples(N_QUESTIONS, HELDOUT_SEED, num_chunks=(4, 6))
    hits = 0
    for ex in examples:
        ids = torch.tensor([encode_prompt(tok, ex.chunks, ex.question)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             do_sample=False)
        assert out[0, -1].item() == tok.eos_token_id or out.shape[1] - ids.shape[1] == 8
        hits += exact_match(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
                            ex.answers)
    assert hits >= 0.8 * N_QUESTIONS, f"{hits}/{N_QUESTIONS}"


def test_profile_blend_recovers_the_pronoun_questions_reuse_loses() -> None:
    """The claim of docs/benchmarks.md on 20 held-out pronoun questions: full reuse loses most,
    blend with ingestion-time profiles at 15 % answers them as full prefill does."""
    from blendrag import NO_CONTEXT, BlendConfig, BlendEngine, GenerationConfig
    from blendrag_demo import PREFIX, format_chunk, format_suffix

    # the figures were measured with chunks computed alone (the demo model knows no prose)
    engine = BlendEngine.from_pretrained(check_demo_model(), chat=False, context=NO_CONTEXT)
    examples = [x for x in generate_examples(200, HELDOUT_SEED) if x.kind == "pronoun"][:20]
    layouts = [engine.build_prompt(PREFIX, [format_chunk(c) for c in x.chunks],
                                   format_suffix(x.question))
               for x in examples]
    for layout in layouts:  # ingestion, in prompt (document) order
        engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids, profile=True)
    gen = GenerationConfig(max_new_tokens=6)

    def accuracy(cfg: BlendConfig) -> float:
        results = [engine.generate(lay, cfg, gen) for lay in layouts]
        assert all(r.stats.cache.profiles_computed == 0 for r in results)
        return sum(exact_match(r.text, x.answers) for r, x in zip(results, examples)) / len(
            examples
        )

    full, reuse = accuracy(BlendConfig(mode="full")), accuracy(BlendConfig(mode="reuse"))
    profile = accuracy(BlendConfig(selector="profile", ratio=0.15))
    assert full >= 0.95 and reuse <= 0.4
    assert profile >= full - 0.05
