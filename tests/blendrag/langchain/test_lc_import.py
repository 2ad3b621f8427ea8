"""blendrag.langchain without LangChain installed: a clear ImportError naming the extra."""

from __future__ import annotations

import importlib
import sys

import pytest


def _forget_blendrag_langchain(monkeypatch) -> None:
    """Make the next import of blendrag.langchain run afresh; everything is restored after."""
    import blendrag

    if hasattr(blendrag, "langchain"):
        monkeypatch.setattr(blendrag, "langchain", blendrag.langchain)  # re-import rebinds it
    for name in [
        m for m in sys.modules if m == "blendrag.langchain" or m.startswith("blendrag.langchain.")
    ]:
        monkeypatch.delitem(sys.modules, name)


def test_missing_langchain_core_names_the_extra(monkeypatch):
    _forget_blendrag_langchain(monkeypatch)
    monkeypatch.setitem(sys.modules, "langchain_core", None)  # import langchain_core -> ImportError
    with pytest.raises(ImportError, match=r"pip install blendrag\[langchain\]"):
        importlib.import_module("blendrag.langchain")


def test_missing_chroma_names_its_extra(monkeypatch):
    pytest.importorskip("langchain_core")
    _forget_blendrag_langchain(monkeypatch)
    monkeypatch.setitem(sys.modules, "langchain_chroma", None)
    module = importlib.import_module("blendrag.langchain")
    assert module.BlendLLM is not None  # the LLM side does not need Chroma
    with pytest.raises(ImportError, match=r"pip install blendrag\[chroma\]"):
        module.BlendChroma  # noqa: B018  (the attribute access imports it)



def test_missing_sentence_transformers_names_its_extra(monkeypatch, tmp_path):
    from blendrag.integration.embedding import load_local_sentence_transformer

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError, match=r"pip install blendrag\[chroma\]"):
        load_local_sentence_transformer(tmp_path)
