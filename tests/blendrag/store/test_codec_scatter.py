"""Whole-entry reads are one scatter read per run of adjacent tensors; short reads resume
exactly."""

from __future__ import annotations

import os

from blendrag.store import readers
from blendrag.store.codec import decode, encode
from helpers.kvgen import make_kv, same_bits

KEY = "c" * 64


def test_more_tensors_than_one_preadv_takes(tmp_path):
    kv = make_kv(1, layers=readers.IOV_MAX // 2 + 3, heads=1, tokens=2, dim=2)  # > IOV_MAX tensors
    path = tmp_path / "entry"
    path.write_bytes(encode(KEY, kv))
    assert same_bits(decode(path, KEY), kv)


def test_partial_scatter_reads_are_resumed(tmp_path, monkeypatch):
    kv = make_kv(2, layers=3, tokens=16)
    path = tmp_path / "entry"
    path.write_bytes(encode(KEY, kv))
    real = os.preadv
    calls = []

    def short_preadv(fd, buffers, offset):  # the kernel may return fewer bytes than asked
        calls.append(len(buffers))
        first = memoryview(buffers[0])
        return real(fd, [first[: max(1, min(len(first), 100))]], offset)

    monkeypatch.setattr(readers.os, "preadv", short_preadv)
    assert same_bits(decode(path, KEY), kv)
    assert len(calls) > 2 * kv.num_layers  # it did take many partial reads
