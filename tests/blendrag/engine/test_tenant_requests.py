"""Tenants through the engine: a poisoned store changes nothing a request returns when the store
has keys (and would without them); one namespace's prefix-cache and history rows are never taken
by another's request; and whether another tenant cached a passage does not show in the time a
request takes (a Kolmogorov-Smirnov test against a cold miss, with a same-tenant hit as the
positive control that must differ)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from blendrag import BlendConfig, EngineSpec, GenerationConfig
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.store import StoreConfig
from blendrag.store.auth import StoreKeys
from blendrag.store.codec import decode, encode
from helpers.backends import Backend
from helpers.tenant_timing import arms, ks
from helpers.tiny import COMPUTED_FIRST, PASSAGES, PREFIX, SUFFIX

KEYS = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
ATTACKER = StoreKeys({"k1": b"an-attackers-own-secret-012345"}, "k1")
BLEND = BlendConfig(ratio=0.2)
GREEDY = GenerationConfig(max_new_tokens=8)


def _spec(model_dir, tmp_path, **store) -> EngineSpec:
    """Requests compute and store their chunks themselves (``COMPUTED_FIRST``): the store holds
    what a request wrote when it returns, and no backfill worker runs beside a timed request."""
    config = StoreConfig(**{"ram_bytes": 0, "disk_dir": tmp_path / "kv", "kv_format": "model",
                            **store})
    return EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="",
                      context=NO_CONTEXT, threads=None, store=config, loading=COMPUTED_FIRST)


def _poison(engine, signer: StoreKeys | None, keys: StoreKeys | None) -> int:
    """Replace every stored entry with rows of noise under the same name and metadata, signed
    with ``signer`` (None: unsigned): what someone who can write the tier can do."""
    tier = Backend.tier(engine.store)
    names = tier.keys()  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(0)
    for name in names:
        kv = decode(Backend.fetch(engine.store, name) or b"", name, keys)
        noise = dataclasses.replace(kv, keys=torch.randn(kv.keys.shape, generator=g) * 3,
                                    values=torch.randn(kv.values.shape, generator=g) * 3)
        tier.put(name, encode(name, noise, signer=signer))
    return len(names)


def test_a_poisoned_store_changes_nothing_with_keys_and_would_without(model_dir, tmp_path):
    spec = _spec(model_dir, tmp_path, auth_key=KEYS)
    layout = spec.build().build_prompt(PREFIX, PASSAGES, SUFFIX)
    empty = spec.build()
    want = empty.generate(layout, BLEND, GREEDY)  # computes and stores every chunk
    want_logits = empty.prefill(layout, BLEND).logits
    assert _poison(empty, ATTACKER, KEYS) >= len(PASSAGES)
    poisoned = spec.build()
    got = poisoned.generate(layout, BLEND, GREEDY)
    assert got.token_ids == want.token_ids and got.text == want.text
    assert torch.equal(poisoned.prefill(layout, BLEND).logits, want_logits)
    assert poisoned.store.stats().auth_failures >= len(PASSAGES)
    # the control: the same forgery, unsigned, in a store without keys is used, and changes
    # what the request returns (which is why the keys matter)
    plain = dataclasses.replace(spec, store=dataclasses.replace(spec.store, auth_key=None,
                                                                disk_dir=tmp_path / "plain"))
    trusting = plain.build()
    trusting.generate(layout, BLEND, GREEDY)
    _poison(trusting, None, None)
    fooled = plain.build().prefill(layout, BLEND).logits
    assert not torch.allclose(fooled, want_logits, atol=1e-3)


def test_no_prefix_cache_or_history_row_crosses_namespaces(model_dir, tmp_path):
    spec = dataclasses.replace(_spec(model_dir, tmp_path), prefix_cache_bytes=1 << 24,
                               prefix_cache_store=True)
    engine = spec.build()
    a, b = engine.namespaced("tenant-a"), engine.namespaced("tenant-b")
    assert engine.namespaced("tenant-a") is a and a.namespaced("") is engine
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    a.generate(layout, BLEND, GREEDY)
    # its chunks and its prefix-cache blocks kept in the store: all under its namespace id
    stored = Backend.tier(engine.store).keys()  # type: ignore[attr-defined]
    assert len(stored) > len(PASSAGES)
    assert all(n.startswith(a.store.namespace_id + ":") for n in stored)
    again = a.prefill(layout, BLEND).stats.cache
    other = b.prefill(layout, BLEND).stats.cache
    assert again.prefix_cache_tokens > layout.num_tokens // 2  # the tenant's own rows
    # none of another's: no prefix-cache or history row, no stored chunk
    assert other.prefix_cache_tokens == 0 and other.history_tokens == 0
    assert other.chunk_hits == 0 and other.chunk_misses == len(PASSAGES)
    assert a.prefix_cache is not b.prefix_cache and a.history is not b.history
    assert a.runner is engine.runner  # one model for every tenant


def test_another_tenants_cache_does_not_show_in_the_time_a_request_takes(model_dir, tmp_path,
                                                                          one_thread):
    spec = _spec(model_dir, tmp_path, ram_bytes=64 << 20, disk_dir=None)
    engine = spec.build()
    a, b = engine.namespaced("tenant-a"), engine.namespaced("tenant-b")
    probe, cold, hit = arms(a, b, samples=250)
    _, p_probe = ks(probe, cold)
    _, p_hit = ks(hit, cold)
    assert p_hit < 1e-6 and np.median(hit) < np.median(cold)  # the test can see a hit
    assert p_probe > 1e-3, (f"a cross-tenant probe is distinguishable from a cold miss "
                            f"(p={p_probe:.2g}; medians {np.median(probe) * 1e3:.2f} vs "
                            f"{np.median(cold) * 1e3:.2f} ms)")
