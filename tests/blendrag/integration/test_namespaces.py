"""Tenant namespaces through both frameworks: an LLM's ``namespace`` (per LLM, or per call from
the application) chooses whose stored entries and recorded chunk texts a request uses; one
tenant's ingested texts are never found in another tenant's flat prompt, and their KVs never
serve another tenant's request."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from blendrag import EngineSpec  # noqa: E402
from blendrag import langchain as lc  # noqa: E402
from blendrag import llamaindex as li  # noqa: E402
from blendrag.engine.caches.context import NO_CONTEXT  # noqa: E402
from blendrag.store import StoreConfig  # noqa: E402
from blendrag.store.names import Names  # noqa: E402
from helpers.tiny import PASSAGES  # noqa: E402

CHUNKS = [p.strip() for p in PASSAGES[:3]]
PROMPT = "Answer from the passages below.\n" + "\n\n".join(CHUNKS) + "\nQuestion: who?\nAnswer:"


@pytest.fixture
def spec(model_dir, tmp_path) -> EngineSpec:
    return EngineSpec(model=model_dir("llama"), device="cpu", chat=False, chunk_prefix="",
                      context=NO_CONTEXT, threads=None,
                      store=StoreConfig(ram_bytes=1 << 24, disk_dir=tmp_path / "kv",
                                        kv_format="model"))


def test_a_tenants_texts_and_kvs_serve_only_that_tenant_langchain(spec, tmp_path):
    engine = spec.build()
    acme = lc.BlendLLM(engine=engine, namespace="acme", max_tokens=1)
    acme.client.ingest(CHUNKS)
    acme.invoke(PROMPT)
    assert acme.last_prompt.matched == len(CHUNKS) and acme.last_stats.cache.chunk_hits
    # the same LLM, per call for another tenant: nothing of acme's is found or used
    other = lc.BlendLLM(engine=engine, max_tokens=1)
    other.invoke(PROMPT, namespace="globex")
    assert other.last_prompt.matched == 0 and other.last_stats.mode == "full"
    acme.invoke(PROMPT, namespace="globex")
    assert acme.last_prompt.matched == 0
    # globex's own documents: acme's stored KVs are not globex's, so none is in its store and
    # the request runs a full prefill (the default), every passage queued for globex
    other.invoke(PROMPT, namespace="globex", documents=[lc_doc(c) for c in CHUNKS])
    assert other.last_prompt.matched == len(CHUNKS)
    s = other.last_stats
    assert s.mode == "full" and s.cache.chunk_hits == 0 and s.cache.backfilled >= len(CHUNKS)
    # then they blend on globex's own entries, computed for it off that request's path
    assert engine.cache.backfill.wait(timeout=60)
    other.invoke(PROMPT, namespace="globex", documents=[lc_doc(c) for c in CHUNKS])
    s = other.last_stats
    assert s.mode == "blend" and s.cache.chunk_hits >= len(CHUNKS) and not s.cache.chunk_misses
    # each namespace's texts are kept in a folder named by its id, not the tenant's name
    folders = sorted(p.name for p in (tmp_path / "kv").iterdir() if "text_index" in p.name)
    ids = {Names(n).ns_id for n in ("acme", "globex")}
    assert {f.split(".", 1)[1] for f in folders if "." in f} == ids
    assert not any("acme" in f or "globex" in f for f in folders)


def lc_doc(text: str):
    from langchain_core.documents import Document

    return Document(page_content=text)


def test_a_tenants_texts_and_kvs_serve_only_that_tenant_llamaindex(spec):
    acme = li.BlendLLM.from_spec(spec, namespace="acme", max_tokens=1)
    acme.client.ingest(CHUNKS)
    acme.complete(PROMPT)
    assert acme.last_prompt.matched == len(CHUNKS)
    acme.complete(PROMPT, namespace="globex")
    assert acme.last_prompt.matched == 0 and acme.last_stats.mode == "full"
    acme.complete(PROMPT, nodes=CHUNKS, namespace="globex")  # none of acme's entries taken
    s = acme.last_stats
    assert s.mode == "full" and s.cache.chunk_hits == 0 and s.cache.backfilled >= len(CHUNKS)
    assert acme.last_prompt.matched == len(CHUNKS)
    assert acme.client.engine.cache.backfill.wait(timeout=60)
    acme.complete(PROMPT, nodes=CHUNKS, namespace="globex")  # globex's own, backfilled
    assert acme.last_stats.mode == "blend" and acme.last_stats.cache.chunk_hits >= len(CHUNKS)
    with pytest.raises(ValueError, match="namespace must be a string"):
        acme.complete(PROMPT, namespace=7)


def test_a_store_config_namespace_is_the_llms_default(spec, tmp_path):
    tenant = spec.store.__class__(**{**spec.store.__dict__, "namespace": "acme"})
    acme = lc.BlendLLM.from_spec(spec.__class__(**{**spec.field_values(), "store": tenant}),
                                 max_tokens=1)
    assert acme.engine.store.namespace == "acme"
    acme.client.ingest(CHUNKS)
    default = lc.BlendLLM.from_spec(spec, max_tokens=1)  # the same folder, default namespace
    default.invoke(PROMPT)
    assert default.last_prompt.matched == 0
    acme.invoke(PROMPT)
    assert acme.last_prompt.matched == len(CHUNKS) and acme.last_stats.cache.chunk_hits


def test_a_namespace_whose_index_file_is_hostile_still_serves_its_requests(spec, caplog):
    """A file that is not a text index in a namespace's index folder (damaged, planted) is
    refused by name with a warning; the namespace's texts are recorded in memory and its
    requests run (they failed with sqlite3's DatabaseError)."""
    import logging

    engine = spec.build()
    ns_id = engine.store.namespaced("tenant-b").namespace_id
    folder = spec.store.disk_dir / f"text_index.{ns_id}"
    folder.mkdir(parents=True)
    (folder / "texts.sqlite3").write_bytes(b"hostile bytes, not a database" * 200)
    llm = lc.BlendLLM(engine=engine, max_tokens=1)
    with caplog.at_level(logging.WARNING):
        llm.invoke(PROMPT, namespace="tenant-b", documents=[lc_doc(c) for c in CHUNKS])
    assert "texts.sqlite3 cannot be used" in caplog.text and "in memory only" in caplog.text
    assert llm.last_prompt.matched == len(CHUNKS)


def test_an_llm_keeps_the_clients_of_the_namespaces_most_recently_served(spec):
    """A namespace per user must not grow an LLM without end: it keeps the clients of the
    ``MAX_VIEWS`` namespaces most recently served, as the engine keeps its views; a namespace
    served again gets its texts back (its text index outlives its client)."""
    from blendrag.engine.views import MAX_VIEWS

    engine = spec.build()
    client = lc.BlendLLM(engine=engine, max_tokens=1).client
    first = client.serving("user-0")
    first.record(CHUNKS)
    for i in range(1, MAX_VIEWS + 5):
        client.serving(f"user-{i}")
    assert len(client._tenants) == MAX_VIEWS and "user-0" not in client._tenants
    again = client.serving("user-0")
    assert again is not first and CHUNKS[0] in again.text_index
    assert client.serving(f"user-{MAX_VIEWS + 4}") is client._tenants[f"user-{MAX_VIEWS + 4}"]
