"""Disk entries whose payload is damaged are a miss from the first request on,
including the entries read whole while a request opens its rows (the ingestion context's
filler prefixes): that request gets the logits of a request over a cold store, and each
damaged entry is deleted and stored again."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.engine.caches.context import ChunkContext
from blendrag.store.auth import StoreKeys
from blendrag.store.disk import DiskTier
from helpers.tiny import PREFIX, SUFFIX

KEYS = StoreKeys({"k1": b"signing-secret-one-0123456789"}, "k1")
CHUNKS = ["fact one.", "fact two.", "fact three."]


def _flip_payload(path, flips: int = 8) -> None:
    """Flip a bit in ``flips`` payload bytes spread over the entry file, its header intact."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    step = max(1, (len(data) - start) // flips)
    for at in range(start + step // 2, len(data), step):
        data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_damaged_disk_entries_are_a_miss_at_the_first_request(engine_for, make_store, tmp_path,
                                                              keys, one_thread):
    config = BlendConfig()  # the default: the preview selector
    engine = engine_for("llama", layers=4, context=ChunkContext())
    engine.store = make_store(kv_format="bfloat16", auth_key=keys)
    layout = engine.build_prompt(PREFIX, CHUNKS, SUFFIX)
    engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)
    disk = DiskTier(engine.store.config.disk_dir, None)
    damaged = disk.keys()
    assert len(damaged) > len(CHUNKS)  # the prefixes of the fillers are stored too
    for key in damaged:
        _flip_payload(disk.entry_path(key))
    engine.store = make_store(kv_format="bfloat16", auth_key=keys)  # a fresh process: empty RAM
    cold = engine_for("llama", layers=4, context=ChunkContext())
    cold.store = make_store(kv_format="bfloat16", disk_dir=tmp_path / "cold")
    ref = cold.prefill(layout, config)

    pre = engine.prefill(layout, config)  # the first request: no exception, the cold logits
    assert torch.equal(pre.logits, ref.logits)
    assert engine.store.stats().tier("disk").corrupt >= len(CHUNKS)
    again = engine.prefill(layout, config)  # every damaged entry was stored again
    assert again.stats.cache.load_retries == 0
    assert again.stats.cache.chunk_hits == len(CHUNKS)
    # the rows as stored (bfloat16 in the store), as a cold store's second request reads them
    assert torch.equal(again.logits, cold.prefill(layout, config).logits)
    out = engine.generate(layout, config, GenerationConfig(max_new_tokens=3))
    assert out.text == cold.generate(layout, config, GenerationConfig(max_new_tokens=3)).text
