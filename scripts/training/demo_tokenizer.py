"""Word-level tokenizer of the demo model, built locally from the corpus vocabulary.

Words, single punctuation marks and newlines are tokens, so every entity of the corpus
(names, cities, years, companies) is one token. ``tokenizer(text)`` prepends ``<s>``
(BOS) unless ``add_special_tokens=False``; anything outside the vocabulary is ``<unk>``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from training_data import vocabulary_texts

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLE_TOKENS: tuple[str, ...] = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK) + ROLE_TOKENS

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Jinja chat template: ``<|role|>`` line, content line, per message; then ``<|assistant|>``."""

_PRE_TOKENIZER = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]|\n"), behavior="removed", invert=True)


def _words(texts: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for text in texts:
        for piece, _ in _PRE_TOKENIZER.pre_tokenize_str(text):
            seen.setdefault(piece, None)
    return sorted(seen)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The demo tokenizer: word-level over the corpus vocabulary, with a chat template."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in _words(list(vocabulary_texts()) + ["\n"]):
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = _PRE_TOKENIZER
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Build the tokenizer and ``save_pretrained`` it into ``directory``; returns it."""
    tok = build_tokenizer()
    tok.save_pretrained(str(directory))
    return tok
