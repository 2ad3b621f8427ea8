"""Tiny random-weight models and a locally trained tokenizer for tests (no hub access).

Models are built from configs, saved with ``save_pretrained`` and loaded back through
``BlendEngine.from_pretrained`` so the real loading code runs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from blendrag.engine.selection.controller import LoadingConfig

# Every request computes the chunks it finds in no store and uses them, as asked: the tests of a
# mode's rows over freshly computed chunks. The default (``full_when_missing=0.5``) runs such a
# request as an exact full prefill and computes its chunks off its path (engine/test_backfill.py).
COMPUTED_FIRST = LoadingConfig(full_when_missing=None)

CORPUS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Lionel Messi scored twice for Argentina; Cristiano Ronaldo answered with a header.",
    "Passage one talks about chemistry, passage two about the history of Oslo and Paris.",
    "Question: who was born first? Answer: the older player, born in 1985.",
    "Retrieval augmented generation reuses the key value cache of every chunk.",
    "She lives in Berlin and works as an engineer at a small company since 2012.",
    "Numbers 0123456789 and punctuation , . ; : ! ? ( ) [ ] { } - _ / \\ \" ' newline\n tab\t",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% "
    "endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "</s>", "<|end|>"]


def build_tokenizer(path: Path, chat: bool = True):
    """Byte-level BPE trained on CORPUS (real merges, so boundary effects exist)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def build_config(family: str, *, layers: int = 3, rope: dict | None = None, tie: bool = False,
                 vocab: int = 420, sliding_window: int | None = None, positions: int = 1024,
                 **extra):
    """A tiny config of ``family``; ``extra``: more config fields (e.g. Phi-3's
    ``partial_rotary_factor``)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=112, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=tie,
                  **extra)
    if rope is not None:
        common["rope_parameters"] = rope
    if family == "llama":
        return LlamaConfig(**common)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=sliding_window)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    return _newer_family_config(family, common, sliding_window)


# Gemma's query_pre_attn_scalar differs from head_dim (as in the real 2B/9B), so a scale read
# from the wrong place shows; Gemma 2's caps are small, so that tiny random logits reach them.
GEMMA_WINDOWED = dict(head_dim=16, query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh")
GEMMA2_CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0)


def _newer_family_config(family: str, common: dict, sliding_window: int | None):
    """Gemma 2/3 (local/global layers alternating, the window defaulting to 16), Phi-3 (its
    config's ``partial_rotary_factor`` and ``sliding_window`` passed through ``common``), OLMo 2."""
    from transformers import Gemma2Config, Gemma3TextConfig, Olmo2Config, Phi3Config

    layers = common["num_hidden_layers"]
    types = ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)]
    window = 16 if sliding_window is None else sliding_window
    if family == "gemma2":
        return Gemma2Config(**common, **GEMMA_WINDOWED, **GEMMA2_CAPS, sliding_window=window,
                            layer_types=types)
    if family == "gemma3":
        return Gemma3TextConfig(**common, **GEMMA_WINDOWED, sliding_window=window,
                                layer_types=types)
    if family == "phi3":
        return Phi3Config(**common, sliding_window=sliding_window)
    if family == "olmo2":
        return Olmo2Config(**common)
    raise ValueError(family)


def save_model(config, path: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Random init leaves tiny logits; larger weights make cross-token effects visible.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.5)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


PASSAGES = [
    "Lionel Messi was born in Rosario and scored twice for Argentina. ",
    "He moved to Paris in 2021, then to Miami; the quick brown fox jumps. ",
    "Cristiano Ronaldo answered with a header; she lives in Berlin since 2012. ",
    "Retrieval augmented generation reuses the key value cache of every chunk. ",
]
PREFIX = "Answer from the passages below.\n"
SUFFIX = "\nQuestion: who was born first?\nAnswer:"


def computed(engine, chunk_prefix_ids, chunk_ids):
    """The chunk's KV as the engine's cache stores it on a miss (in the engine's ingestion
    context), computed now and not stored: the reference a stored entry must equal."""
    cache = engine.cache
    kv, _ = cache.compute_pair(cache.prefix(chunk_prefix_ids), chunk_prefix_ids, chunk_ids,
                               engine.context)
    return kv


def decoded_alone(engine, prefills, steps: int) -> list[list[torch.Tensor]]:
    """Each of ``prefills`` decoded on its own for ``steps`` greedy tokens: per prefill, the
    logits of every step (what a batched step's rows are compared with)."""
    runs = []
    for pre in prefills:
        logits, seen = pre.logits, []
        for _ in range(steps):
            logits = engine.runner.decode(int(torch.argmax(logits)), pre.fused)
            seen.append(logits)
        runs.append(seen)
    return runs
