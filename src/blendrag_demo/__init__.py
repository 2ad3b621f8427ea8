"""blendrag's demo: ``blendrag demo`` (``run.py``), its corpora, and the embedded tiny model.

The tiny model is a Llama trained on a synthetic multi-document QA corpus (``corpus.py``).
``demo_model_path()`` is the packaged model directory (safetensors weights, config,
word-level tokenizer with a chat template); it loads offline with
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``. Prompts are
``PREFIX`` + ``format_chunk(passage)`` for each passage + ``format_suffix(question)``,
tokenized piece by piece (``encode_pieces`` / ``encode_prompt``); the model answers with a
few words and EOS. See ``blendrag_demo.corpus`` and ``model/TRAINING.md``.

This package depends on the core (``blendrag``), never the reverse: it adds the ``demo``
command and the model name ``demo`` through the entry-point groups ``blendrag.commands`` and
``blendrag.models`` (see ``pyproject.toml``).
"""

from __future__ import annotations

from pathlib import Path

from blendrag_demo.corpus import (
    CROSS_CHUNK_KINDS,
    HELDOUT_SEED,
    KINDS,
    PREFIX,
    SUFFIX_TEMPLATE,
    PromptPieces,
    QAExample,
    encode_pieces,
    encode_prompt,
    exact_match,
    format_chunk,
    format_suffix,
    generate_examples,
    normalize_answer,
    prompt_pieces,
)

_MODEL_DIR = Path(__file__).resolve().parent / "model"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

__all__ = [
    "CROSS_CHUNK_KINDS",
    "HELDOUT_SEED",
    "KINDS",
    "PREFIX",
    "SUFFIX_TEMPLATE",
    "PromptPieces",
    "QAExample",
    "check_demo_model",
    "demo_model_path",
    "encode_pieces",
    "encode_prompt",
    "exact_match",
    "format_chunk",
    "format_suffix",
    "generate_examples",
    "normalize_answer",
    "prompt_pieces",
]


def demo_model_path() -> Path:
    """Directory of the packaged demo model and tokenizer (pass it to ``from_pretrained``)."""
    return _MODEL_DIR


def check_demo_model(path: Path | None = None) -> Path:
    """Return the model directory after checking its files are there.

    Raises ``FileNotFoundError`` naming the missing files (e.g. when the package was
    installed without its data, or the model was not trained yet: run
    ``scripts/training/train_demo_model.py``).
    """
    directory = demo_model_path() if path is None else Path(path)
    missing = [name for name in _REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"demo model incomplete in {directory}: missing "
                                f"{', '.join(missing)}")
    return directory
