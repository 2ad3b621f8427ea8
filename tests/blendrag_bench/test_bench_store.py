"""`blendrag bench store` on a small workload: every figure is there and the byte count adds up."""

from __future__ import annotations

import json

import pytest

from blendrag.cli import main
from blendrag_bench.raw_io import drop_page_cache, resident_fraction
from blendrag_servers.redis_server import REDIS_BINARY

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_store_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "store.json"
    argv = ["bench", "store", "--layers", "2", "--chunks", "2", "--chunk-tokens", "32", "--repeats",
            "1",
            "--json", str(out)]
    assert main(argv) == 0
    assert "precompute vs HF forward" in capsys.readouterr().out
    r = json.loads(out.read_text())
    # layers x kv_heads x head_dim x fp32, K and V
    assert r["bytes_per_token_formula"] == 2 * 2 * 2 * 64 * 4
    assert (
        r["entry_bytes"] == r["bytes_per_token_formula"] * r["entry_tokens"] + r["metadata_bytes"]
    )
    assert 0 < r["metadata_bytes"] < 16 << 10
    assert r["precompute_tokens_per_s"] > 0 and r["hf_forward_tokens_per_s"] > 0
    assert set(r["load_gbps"]) == set(r["raw_read_gbps"]) == {"ram", "disk", "redis",
                                                              "redis_cluster", "s3"}
    assert r["load_gbps"]["s3"] is None and r["tier_notes"]["s3"] == "not requested"
    assert all(r["load_gbps"][t] > 0 and r["raw_read_gbps"][t] > 0 for t in ("ram", "disk"))
    if REDIS_BINARY is None:
        assert r["load_gbps"]["redis"] is None and "redis-server" in r["tier_notes"]["redis"]
    else:
        assert r["load_gbps"]["redis"] > 0
    # per stored format: bytes per token (int8 pays float32 scales: at 64-dim heads and 32-token
    # chunks about a third of float32's), encode and load rates, the default marked
    formats = {f["format"]: f for f in r["formats"]}
    assert set(formats) == {"model", "bfloat16", "float16", "int8"}
    assert formats["bfloat16"]["default"] and sum(f["default"] for f in r["formats"]) == 1
    assert formats["model"]["bytes_vs_model"] == 1.0
    for half in ("bfloat16", "float16"):
        assert 0.5 < formats[half]["bytes_vs_model"] < 0.55
    assert formats["int8"]["bytes_vs_model"] < 0.4
    assert all(f["encode_gbps"] > 0 and f["load_gbps"] > 0 for f in r["formats"])


def test_page_cache_can_be_dropped_and_checked(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * (1 << 20))
    path.read_bytes()
    assert resident_fraction(path) in (None, 1.0)
    if drop_page_cache(path):
        assert resident_fraction(path) == 0.0


def test_the_hf_yardstick_computes_the_chunk_over_the_prefix_once_computed(monkeypatch):
    """The precompute computes a chunk over a prefix it computed once; the HF forward it is
    set against does the same (it ran the prefix again each time, credited with the chunk's
    tokens only): the chunk's ids alone go in, after a copy of the prefix's cache, and give a
    forward of prefix + chunk's logits."""
    import torch

    from blendrag_bench import store_compute as store
    from blendrag_bench.ttft import TTFTWorkload, build_engine

    engine = build_engine(TTFTWorkload(layers=2, hidden=64, heads=4, kv_heads=2,
                                       intermediate=128, vocab=300, device="cpu"))
    prefix, chunk = list(range(3, 13)), list(range(20, 52))
    past = store.prefix_cache(engine, prefix)
    seen: list[tuple] = []
    forward = engine.model.forward

    name = store.cache_arg(engine.model)

    def recorded(ids, *args, **kwargs):
        seen.append((ids.shape[1], kwargs[name].get_seq_length()))
        return forward(ids, *args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", recorded)
    for _ in range(2):  # the prefix's cache is copied: the second call starts from it too
        store.hf_seconds(engine, [chunk], past)
    assert seen == [(len(chunk), len(prefix))] * 2
    monkeypatch.undo()
    with torch.inference_mode():
        whole = engine.model(torch.tensor([prefix + chunk])).logits[0, -1]
        after = engine.model(torch.tensor([chunk]), **{name: store.copy.deepcopy(past)}
                             ).logits[0, -1]
    assert torch.allclose(whole, after, atol=1e-4)
