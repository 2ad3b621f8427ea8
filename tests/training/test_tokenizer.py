"""The demo tokenizer: word-level, BOS on request, chat template, save/load round trip."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from demo_tokenizer import CHAT_TEMPLATE, build_tokenizer, save_tokenizer


def test_entities_are_single_tokens() -> None:
    tok = build_tokenizer()
    for word in ("Lena", "Park", "Oslo", "1971", "Norvex", "chemist", "\n"):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1
    assert tok("Lena Park", add_special_tokens=True)["input_ids"][0] == tok.bos_token_id
    assert tok.decode(tok("Lena Park", add_special_tokens=False)["input_ids"]) == "Lena Park"
    assert tok("Zyzzyva", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    tok = save_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    text = "Lena Park is a chemist from Oslo.\nShe was born in 1971."
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token, loaded.unk_token) == (
        "<s>",
        "</s>",
        "<pad>",
        "<unk>",
    )
    assert loaded.chat_template == CHAT_TEMPLATE


def test_chat_template() -> None:
    tok = build_tokenizer()
    messages = [{"role": "system", "content": "Answer the question."},
                {"role": "user", "content": "Where is Norvex based?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (
        text
        == "<s><|system|>\nAnswer the question.\n<|user|>\nWhere is Norvex based?\n<|assistant|>\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.unk_token_id not in ids
    assert tok.convert_tokens_to_ids("<|assistant|>") in ids
