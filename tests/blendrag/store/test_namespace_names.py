"""Namespace names are printable by Unicode category (a control, format, surrogate, private-use,
unassigned or separator character is refused by its code point), and a tenant never gets the
store's public namespace (the ingestion job writes it through ``store.namespaced``)."""

from __future__ import annotations

import pytest

from blendrag.store import StoreConfig
from blendrag.store.names import Names, check_namespace, check_tenant_namespace
from blendrag.store.ram import MemoryKVStore
from helpers.kvgen import make_kv, same_bits


@pytest.mark.parametrize(("char", "category"), [
    ("\x7f", "Cc"),  # DEL
    ("\x85", "Cc"),  # NEXT LINE
    ("\u2028", "Zl"),  # LINE SEPARATOR
    ("\u2029", "Zp"),  # PARAGRAPH SEPARATOR
    ("\u202e", "Cf"),  # RIGHT-TO-LEFT OVERRIDE: the name would read backwards
    ("\u200b", "Cf"),  # ZERO WIDTH SPACE: two names that look the same
    ("\ud800", "Cs"),  # a lone surrogate: no UTF-8 for it, it failed at the first write
    ("\ue000", "Co"),  # private use
    ("\u0378", "Cn"),  # unassigned
    ("\u00a0", "Zs"),  # NO-BREAK SPACE: looks like a space, is not one
])
def test_a_non_printable_character_is_refused_by_its_code_point(char, category):
    name = f"acme{char}corp"
    with pytest.raises(ValueError, match=rf"U\+{ord(char):04X} at index 4 .*{category}"):
        check_namespace(name)
    with pytest.raises(ValueError, match="namespace"):
        StoreConfig(namespace=name)
    with pytest.raises(ValueError, match=f"U\\+{ord(char):04X}"):
        MemoryKVStore(1 << 20).namespaced(name)


@pytest.mark.parametrize("name", ["acme-corp", "globex/alice", "Åsa Ström", "東京:営業",
                                  "ümlaut_ß", "a b", "emoji \U0001f600", "x" * 256])
def test_printable_names_are_accepted_and_written(name):
    assert check_namespace(name) == name
    store = MemoryKVStore(1 << 20).namespaced(name)
    store.put("chunk", make_kv(1))  # a name that is accepted is also one that can be written
    assert same_bits(store.get("chunk"), make_kv(1))
    assert Names(name).ns_id and name not in Names(name).ns_id


def test_a_too_long_name_says_its_length():
    with pytest.raises(ValueError, match="got 257"):
        check_namespace("x" * 257)


def test_a_tenant_never_gets_the_public_namespace():
    with pytest.raises(ValueError, match="public_namespace"):
        check_tenant_namespace("public", "public")
    assert check_tenant_namespace("acme", "public") == "acme"
    assert check_tenant_namespace("public", None) == "public"  # no corpus shared: any name
    with pytest.raises(ValueError, match="U\\+007F"):
        check_tenant_namespace("bad\x7f", "public")


def test_a_store_config_cannot_make_a_tenant_of_its_public_namespace(tmp_path):
    from blendrag.store import StoreConfig, TieredKVStore

    with pytest.raises(ValueError, match="public_namespace"):
        StoreConfig(ram_bytes=1 << 20, namespace="public", public_namespace="public")
    tenant = TieredKVStore(StoreConfig(ram_bytes=1 << 20, namespace="acme",
                                       public_namespace="public"))
    job = tenant.namespaced("public")  # the ingestion job's view: writes the public corpus
    assert job.namespace == "public" and job.config.public_namespace is None
