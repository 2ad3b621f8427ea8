"""Test doubles that record what the code under test did: which prefills ran over the runner's
pooled KV buffer, and which texts a text index was given."""

from __future__ import annotations


def pooled_prefills(monkeypatch) -> list[bool]:
    """Per ``BlendEngine.prefill`` from now on, whether its request ran over the runner's pooled
    KV buffer (a request another one still held took a buffer of its own)."""
    from blendrag.engine.engine import BlendEngine

    pooled: list[bool] = []
    prefill = BlendEngine.prefill

    def seen(self, *args, **kwargs):
        pre = prefill(self, *args, **kwargs)
        pooled.append(self.runner._pool.lent(pre.fused))
        return pre

    monkeypatch.setattr(BlendEngine, "prefill", seen)
    return pooled


class RecordingIndex:
    """A text index that keeps what it is given."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def record(self, texts):
        self.texts += texts
        return len(texts)
