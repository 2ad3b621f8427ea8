"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine

MIB = 1 << 20


@pytest.fixture
def chat_engine(model_dir):
    """factory(**BlendEngine kwargs) -> the tiny Llama with a 64 MiB prefix cache unless told
    otherwise (and so the history cache too): the caches' chat tests."""
    def make(**kw) -> BlendEngine:
        kw.setdefault("prefix_cache_bytes", 64 * MIB)
        return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, **kw)

    return make
