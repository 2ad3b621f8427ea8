"""Tenant namespaces in every tier (RAM, disk, Redis, Redis Cluster, S3, on the real servers the
suite starts): one namespace's entries are a hit for it and a miss for every other; stored names
carry the namespace id under a physical prefix of its own, never the tenant's name or any text;
clearing one namespace leaves the others."""

from __future__ import annotations

import pytest

from blendrag.store import StoreConfig
from blendrag.store.auth import StoreKeys
from blendrag.store.names import Names
from helpers.backends import KINDS, Backend
from helpers.kvgen import make_kv, same_bits

KEYS = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
TENANT_A, TENANT_B = "acme-corp", "globex/alice"


@pytest.fixture(params=KINDS)
def backend(request, tmp_path) -> Backend:
    return Backend(request.param, request, tmp_path)


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_a_namespace_hits_its_own_entries_and_every_other_misses(backend, keys):
    store = backend.store(namespace=TENANT_A, auth_key=keys)
    kv = make_kv(1)
    store.put("chunk", kv)
    other, default = store.namespaced(TENANT_B), store.namespaced("")
    # paired: the same namespace hits (nothing to compute), the others miss
    assert same_bits(store.get("chunk"), kv)
    for view in (other, default):
        assert view.get("chunk") is None and not view.contains("chunk")
        assert view.open_layers("chunk") is None and view.missing(["chunk"]) == ["chunk"]
    # a new process of the tenant (RAM: this one, the entries die with it)
    again = store if backend.kind == "ram" else backend.store(namespace=TENANT_A, auth_key=keys)
    entry = again.open_layers("chunk")
    assert entry is not None and entry.key == "chunk"  # the content key, not the stored name
    entry.close()
    stranger = backend.store(namespace=TENANT_B, auth_key=keys)
    assert stranger.get("chunk") is None
    stranger.close()
    other.put("chunk", make_kv(2))  # the same content key in another namespace: its own entry
    assert same_bits(store.get("chunk"), kv) and same_bits(other.get("chunk"), make_kv(2))
    store.close()
    again.close()


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_stored_names_hold_the_namespace_id_never_the_tenant_or_the_text(backend, keys):
    store = backend.store(namespace=TENANT_A, auth_key=keys)
    store.put("c0ffee" * 10, make_kv(3))
    ns_id = Names(TENANT_A, keys).ns_id
    names = backend.raw_names(store)
    assert len(names) == 1
    (name,) = names
    assert ns_id and ns_id in name and "acme" not in name
    # a physical prefix per namespace, for Redis ACLs and bucket policies
    if backend.kind in ("redis", "redis_cluster"):
        assert name.startswith(f"{backend.prefix}:{ns_id}:")
    elif backend.kind == "s3":
        assert name.startswith(f"{backend.prefix}/{ns_id}/")
    else:
        assert name.startswith(f"{ns_id}:")
    # keyed: the name does not give the content key away (a listing cannot test a guess)
    assert ("c0ffee" in name) == (keys is None)
    # the ids differ by key: without it, no one can compute a tenant's prefix from its name
    assert Names(TENANT_A, keys).ns_id != Names(TENANT_A, StoreKeys(
        {"k9": b"another-secret-0123456789"}, "k9")).ns_id
    store.close()


def test_the_default_namespace_without_keys_keeps_todays_names(backend):
    store = backend.store()
    store.put("abc123", make_kv(4))
    names = backend.raw_names(store)
    assert [n.rsplit(":", 1)[-1].rsplit("/", 1)[-1] for n in names] == ["abc123"]
    assert store.namespace == "" and store.namespace_id == ""
    store.close()


def test_clearing_one_namespace_leaves_the_others(backend):
    store = backend.store(namespace=TENANT_A)
    other, default = store.namespaced(TENANT_B), store.namespaced("")
    for view, seed in ((store, 5), (other, 6), (default, 7)):
        view.put("chunk", make_kv(seed))
    store.clear()
    assert store.get("chunk") is None
    assert same_bits(other.get("chunk"), make_kv(6))
    assert same_bits(default.get("chunk"), make_kv(7))
    default.clear()
    assert default.get("chunk") is None and same_bits(other.get("chunk"), make_kv(6))
    store.close()


def test_a_view_shares_the_tiers_and_closes_nothing(backend):
    store = backend.store(namespace=TENANT_A)
    view = store.namespaced(TENANT_B)
    view.put("chunk", make_kv(8))
    view.close()  # the owner's tiers stay open
    assert same_bits(view.get("chunk"), make_kv(8)) and store.get("chunk") is None
    assert view.tiers == store.tiers and view.namespace == TENANT_B
    store.close()


@pytest.mark.parametrize("bad", [3, "x" * 300, "tab\there"])
def test_a_bad_namespace_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="namespace"):
        StoreConfig(namespace=bad)


def test_the_location_of_a_namespace_is_its_own(tmp_path):
    base = StoreConfig(ram_bytes=0, disk_dir=tmp_path)
    a, b = (StoreConfig(ram_bytes=0, disk_dir=tmp_path, namespace=n) for n in (TENANT_A,
                                                                                TENANT_B))
    assert len({base.location(), a.location(), b.location()}) == 3
    assert TENANT_A not in str(a.location())


def test_a_public_namespace_is_read_by_every_tenant_and_written_only_by_its_job(backend):
    tenant = backend.store(namespace=TENANT_A, public_namespace="public", auth_key=KEYS)
    job = tenant.namespaced("public")  # the ingestion job (RAM: it must be this process)
    job.put("shared", make_kv(9))
    assert same_bits(tenant.get("shared"), make_kv(9)) and tenant.contains("shared")
    entry = tenant.open_layers("shared")
    assert entry is not None and entry.key == "shared"
    entry.close()
    tenant.put("mine", make_kv(10))  # a tenant's own computation stays in its namespace
    assert not job.contains("mine") and job.get("mine") is None
    loner = backend.store(namespace=TENANT_B, auth_key=KEYS)  # not opted in: nothing shared
    assert loner.get("shared") is None
    tenant.close()
    loner.close()
