"""The demo's prompt format: ``PREFIX + chunk_1 + ... + chunk_n + suffix``, each piece tokenized
on its own (docs/architecture.md, "Exactness rules"), then the answer and EOS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PREFIX = "Read the passages and answer the question in a few words.\nPassages:\n"
"""Instruction that starts every prompt (tokenized with the BOS token)."""

CHUNK_TEMPLATE = "{text}\n"
"""How one passage is written into the prompt: its text and a newline."""

SUFFIX_TEMPLATE = "Question: {question}\nAnswer:"
"""The suffix: the question and the answer cue; the answer follows it, then EOS."""


def format_chunk(text: str) -> str:
    """The prompt piece of one passage."""
    return CHUNK_TEMPLATE.format(text=text)


def format_suffix(question: str) -> str:
    """The prompt piece after the passages: question and answer cue."""
    return SUFFIX_TEMPLATE.format(question=question)


@dataclass(frozen=True)
class PromptPieces:
    """The three kinds of prompt pieces, each tokenized on its own (docs/architecture.md)."""

    prefix: str
    chunks: list[str]
    suffix: str


def prompt_pieces(chunks: Sequence[str], question: str) -> PromptPieces:
    """Prefix, formatted chunks and suffix of the prompt for ``question`` over ``chunks``."""
    return PromptPieces(PREFIX, [format_chunk(c) for c in chunks], format_suffix(question))


def encode_pieces(
    tokenizer: Any, pieces: PromptPieces
) -> tuple[list[int], list[list[int]], list[int]]:
    """Token ids of the prefix (with BOS), of each chunk and of the suffix (no specials)."""
    prefix = list(tokenizer(pieces.prefix, add_special_tokens=True)["input_ids"])
    chunks = [list(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in pieces.chunks]
    suffix = list(tokenizer(pieces.suffix, add_special_tokens=False)["input_ids"])
    return prefix, chunks, suffix


def encode_prompt(tokenizer: Any, chunks: Sequence[str], question: str) -> list[int]:
    """The prompt ids: prefix ids + each chunk's ids + suffix ids, tokenized piece by piece."""
    prefix, chunk_ids, suffix = encode_pieces(tokenizer, prompt_pieces(chunks, question))
    return prefix + [t for ids in chunk_ids for t in ids] + suffix
