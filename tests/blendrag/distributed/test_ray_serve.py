"""Two Ray Serve replicas of one engine on a single-node Ray cluster on 127.0.0.1, sharing one
Redis tier: a chunk ingested through one replica is served as a hit by the other; the HTTP
route answers completions in OpenAI's shape, keeps a namespace's passages to it and refuses
bad bodies (unknown keys too) with a 400. Skipped, saying
why, without Ray Serve (``pip install "blendrag[serve]"``)."""

from __future__ import annotations

import socket

import pytest

from blendrag.spec import EngineSpec
from blendrag.store import StoreConfig
from helpers.ray_cluster import import_ray, local_cluster
from helpers.tiny import PASSAGES

import_ray()
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install "
                                                "'blendrag[serve]') - serving on Ray untested")
httpx = pytest.importorskip("httpx")
from blendrag.distributed.ray_serve import ServeSettings, app  # noqa: E402

pytestmark = [pytest.mark.processes]
DOCS = [p.strip() for p in PASSAGES[:3]]


def _prompt(question: str, docs: list[str] = DOCS) -> str:
    from blendrag.integration.chunks import ChunkFormat

    fmt = ChunkFormat()
    return ("Answer from the passages.\n" + fmt.join([fmt.format(d) for d in docs])
            + f"\nQuestion: {question}\nAnswer:")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(model_dir, redis_server):
    spec = EngineSpec(model=str(model_dir("llama")), device="cpu", chat=False, chunk_prefix="",
                      store=StoreConfig(ram_bytes=64 << 20, disk_dir=None,
                                        redis_url=redis_server.url, redis_prefix="serve:"))
    port = _free_port()
    with local_cluster(num_cpus=2):
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handle = serve.run(app(ServeSettings(spec, replicas=2, cpus_per_replica=0.5)),
                           name="blendrag", route_prefix="/")
        try:
            yield handle, f"http://127.0.0.1:{port}"
        finally:
            serve.shutdown()


def test_a_chunk_ingested_through_one_replica_is_a_hit_on_the_other(served):
    handle, _ = served
    ingested = handle.ingest.remote(DOCS).result()
    assert ingested["computed"] == len(DOCS)
    body = {"prompt": _prompt("who was born first?"), "documents": DOCS, "max_tokens": 4}
    others = []
    for _ in range(40):  # Ray Serve picks the replica: ask until the other one answers
        answer = handle.complete.remote(body).result()
        if answer["replica"] != ingested["replica"]:
            others.append(answer)
            break
    assert others, "every request went to the replica that ingested"
    stats = others[0]["blendrag"]
    # the documents and the separators between them, every one read from the shared tier
    assert stats["chunk_hits"] >= len(DOCS) and stats["chunk_misses"] == 0
    assert others[0]["usage"]["completion_tokens"] == 4


def test_http_route_answers_and_refuses_bad_bodies(served):
    _, url = served
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.get("/health").json()["status"] == "ok"
        r = http.post("/v1/completions", json={"prompt": _prompt("where?"), "documents": DOCS,
                                               "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("length", "eos", "stop")
        assert http.post("/v1/completions", json={"prompt": 3}).status_code == 400
        assert http.post("/v1/ingest", json={"texts": "not a list"}).status_code == 400
        for body in (b'{"prompt": "hi", "max_tokens": 1e400}',  # no int: OverflowError
                     b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):  # too deep
            assert http.post("/v1/completions", content=body).status_code == 400
        assert http.post("/v1/nowhere", json={}).status_code == 404


def test_a_request_whose_passages_were_never_ingested_is_answered(served):
    """It runs as a full prefill; the stats' predictions are then NaN (none made), sent as
    null: strict JSON has no NaN."""
    _, url = served
    docs = [d + " Never ingested." for d in DOCS]
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/v1/completions", json={"prompt": _prompt("who?", docs),
                                               "documents": docs, "max_tokens": 1})
        assert r.status_code == 200, r.text
        stats = r.json()["blendrag"]
        assert (stats["mode"], stats["chunk_hits"]) == ("full", 0)
        assert stats["controller"]["mode"]["predicted_s"] is None


def test_a_namespace_keeps_a_tenants_passages_apart_and_unknown_keys_are_refused(served):
    _, url = served
    docs = [d + " Tenant A's copy." for d in DOCS]
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/v1/ingest", json={"texts": docs, "namespace": "tenant-a"})
        assert r.status_code == 200, r.text
        assert r.json()["computed"] == len(docs)

        def stats(namespace: str | None) -> dict:
            body = {"prompt": _prompt("who?", docs), "documents": docs, "max_tokens": 1,
                    **({"namespace": namespace} if namespace is not None else {})}
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["blendrag"]

        # any replica: the tenant's KVs are in the shared tier, under its namespace only
        tenant = stats("tenant-a")
        assert tenant["chunk_hits"] >= len(docs) and tenant["chunk_misses"] == 0
        for other in (None, "tenant-b"):  # the default namespace, another tenant
            found = stats(other)
            assert (found["chunk_hits"], found["mode"]) == (0, "full")
        refused = http.post("/v1/ingest", json={"texts": docs, "tenant": "a"})
        assert refused.status_code == 400
        assert "'tenant'" in refused.json()["error"] and "namespace" in refused.json()["error"]
        typo = http.post("/v1/completions", json={"prompt": "hi", "max_token": 1})
        assert typo.status_code == 400
        assert "'max_token'" in typo.json()["error"] and "max_tokens" in typo.json()["error"]
        bad = http.post("/v1/ingest", json={"texts": docs, "namespace": 3})
        assert bad.status_code == 400 and "\"namespace\" must be a string" in bad.json()["error"]


def test_settings_need_a_shared_tier(model_dir):
    with pytest.raises(ValueError, match="shared tier"):
        ServeSettings(EngineSpec(model=str(model_dir("llama")), store=StoreConfig(disk_dir=None)))
    with pytest.raises(ValueError, match="replicas"):
        ServeSettings(EngineSpec(model="x", store=StoreConfig(disk_dir=None,
                                                              redis_url="redis://h:1/0")),
                      replicas=0)
