"""Chunk keys: they change with whatever changes the KV rows, and nothing else (across
processes too)."""

from __future__ import annotations

import pytest
import torch

from blendrag.kv.keys import chunk_key, hash_ids, model_fingerprint, tokenizer_fingerprint
from helpers import procs

PREFIX, CHUNK = [1, 5, 9], [17, 3, 3, 40]


def _config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    return LlamaConfig(**{**base, **kw})


def _model(seed: int = 0, **kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(_config(**kw)).eval()


def _tokenizer(extra_word: str = "delta"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "alpha", "beta", "gamma", extra_word])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.fixture(scope="module")
def base():
    return model_fingerprint(_model(0)), tokenizer_fingerprint(_tokenizer())


def _key(model_fp: str, tok_fp: str, prefix=PREFIX, chunk=CHUNK) -> str:
    return chunk_key(model_fp, tok_fp, prefix, chunk)


def test_identical_inputs_give_identical_keys(base):
    m, t = base
    assert model_fingerprint(_model(0)) == m and tokenizer_fingerprint(_tokenizer()) == t
    assert _key(m, t) == _key(m, t) and len(_key(m, t)) == 64


def test_weights_change_the_key(base):
    m, t = base
    assert model_fingerprint(_model(1)) != m  # another init
    tuned = _model(0)
    with torch.no_grad():
        tuned.model.layers[1].mlp.down_proj.weight[3, 7] += 1e-3  # one weight, fine-tune sized
    assert model_fingerprint(tuned) != m
    assert _key(model_fingerprint(tuned), t) != _key(m, t)


def test_dtype_changes_the_key(base):
    m, t = base
    assert model_fingerprint(_model(0).to(torch.bfloat16)) != m
    assert model_fingerprint(_model(0).to(torch.float16)) != model_fingerprint(
        _model(0).to(torch.bfloat16)
    )


def test_architecture_config_changes_the_key(base):
    m, _ = base
    assert model_fingerprint(_model(0, rope_theta=500000.0)) != m


def test_tokenizer_changes_the_key(base):
    m, t = base
    other = tokenizer_fingerprint(_tokenizer(extra_word="epsilon"))
    assert other != t and _key(m, other) != _key(m, t)


def test_prefix_and_chunk_ids_change_the_key(base):
    m, t = base
    k = _key(m, t)
    assert _key(m, t, prefix=[1, 5, 8]) != k
    assert _key(m, t, prefix=[]) != k
    assert _key(m, t, chunk=CHUNK[:-1]) != k
    # Moving a token across the prefix/chunk boundary is a different entry.
    assert _key(m, t, prefix=PREFIX + CHUNK[:1], chunk=CHUNK[1:]) != k
    assert hash_ids([1, 2]) != hash_ids([2, 1]) and hash_ids([]) != hash_ids([0])


@pytest.mark.processes
def test_keys_are_equal_across_processes(tmp_path, base):
    from transformers import AutoModelForCausalLM

    model = _model(0)
    model.save_pretrained(str(tmp_path))
    _tokenizer().save_pretrained(str(tmp_path))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    m, t = model_fingerprint(loaded), base[1]
    assert m == base[0]  # save/load does not change the identity
    as_bf16 = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    assert model_fingerprint(as_bf16) == model_fingerprint(_model(0).to(torch.bfloat16)) != m
    child = procs.run("fingerprint", {"model_dir": str(tmp_path), "prefix": PREFIX, "chunk": CHUNK})
    assert child == {"model": m, "tokenizer": tokenizer_fingerprint(_tokenizer()),
                     "key": _key(m, t)}
