"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest

from blendrag import BlendEngine
from helpers.tiny import COMPUTED_FIRST

MIB = 1 << 20


@pytest.fixture
def chat_engine(model_dir):
    """factory(**BlendEngine kwargs) -> the tiny Llama with a 64 MiB prefix cache unless told
    otherwise (and so the history cache too): the caches' chat tests, whose first turns compute
    their chunks in the request (``COMPUTED_FIRST``) rather than run a full prefill."""
    def make(**kw) -> BlendEngine:
        kw.setdefault("prefix_cache_bytes", 64 * MIB)
        kw.setdefault("loading", COMPUTED_FIRST)
        return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, **kw)

    return make
