"""Write a tiny Llama as a GGUF file with the ``gguf`` package, the way llama.cpp's converter
does (q/k rows permuted for its RoPE layout, byte-level BPE tokenizer in the metadata), so that
tests load a real GGUF through transformers' reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (transformers' GGUF reader undoes it)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_llama_gguf(model, tokenizer_dir: Path, path: Path) -> Path:
    """Write ``model`` (a LlamaForCausalLM) and the fast tokenizer saved in ``tokenizer_dir``
    as one GGUF file (float32 tensors) at ``path``."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, tokenizer_dir)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        data = t.detach().to(torch.float32).numpy().copy()
        if ".q_proj." in hf_name:
            data = _permute(data, cfg.num_attention_heads)
        elif ".k_proj." in hf_name:
            data = _permute(data, cfg.num_key_value_heads)
        w.add_tensor(f"{names.get_name(base)}.{suffix}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tokenizer(w, tokenizer_dir: Path) -> None:
    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["content"]: a["id"] for a in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<s>"])
    w.add_eos_token_id(specials["</s>"])
    w.add_pad_token_id(specials["<pad>"])
    w.add_add_bos_token(False)
